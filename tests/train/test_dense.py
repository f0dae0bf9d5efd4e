"""Dense training (``train.predict_at = "all"``): every position of a window predicts the next click."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from recsys.config import ConfigError, load_config
from recsys.data.batches import TrainSampler, WindowSampler
from recsys.models import build_model, model_names, spec_for
from recsys.train.losses import interest_cosine
from recsys.train.step import TrainStep
from tests.conftest import resolved

DENSE = [name for name in model_names() if spec_for(name).dense]
# each dense model, and the multi-interest ones again with the interest regulariser on every prefix
WITH_REGULARISERS = [(n, []) for n in DENSE] + [
    (n, ["train.interest_reg=1", "train.interest_margin=-1"]) for n in DENSE if spec_for(n).multi_interest
]
NUM_ITEMS, MAX_LEN = 40, 7


def _step(name: str, targets: str, *extra: str) -> TrainStep:
    # causal attention blocks where the model's automatic ones read the whole window (next_mi's)
    causal = ["model.mixer=attention"] if spec_for(name).automatic.mixer == "wavelet" else []
    cfg = resolved(
        load_config(
            None,
            [
                f"model.name={name}",
                f"train.predict_at={targets}",
                "model.dim=16",
                "model.num_heads=2",
                "model.dropout=0",
                "model.backend=torch",
                "model.num_interests=3",
                "train.num_negatives=12",
                "train.attention_reg=0",  # last-position only: dense training does not compute it
                "train.predict_next=1",  # automatic: follows the data's timestamps
                *causal,
                *extra,
            ],
        ),
        NUM_ITEMS,
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, NUM_ITEMS, MAX_LEN)
    counts = torch.ones(NUM_ITEMS, dtype=torch.long)
    return TrainStep(model, cfg, torch.device("cpu"), counts, torch.Generator().manual_seed(0))


def _negatives(step: TrainStep) -> tuple[torch.Tensor, torch.Tensor]:
    generator = getattr(step.objective, "generator", None)  # the exact softmax draws nothing
    if generator is not None:
        generator.manual_seed(3)
    return step.negatives()


@pytest.mark.parametrize("name, regularisers", WITH_REGULARISERS)
@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_a_window_of_one_target_gives_the_last_position_loss(name, regularisers, loss):
    """With one input click per row, dense and last-position training compute the same loss and gradients."""
    extra = [f"train.full_softmax={str(loss == 'full').lower()}", *regularisers]
    rng = np.random.default_rng(1)
    seq = torch.from_numpy(rng.integers(1, NUM_ITEMS, (5, MAX_LEN)))
    lengths = torch.ones(5, dtype=torch.long)
    nxt = torch.from_numpy(rng.integers(1, NUM_ITEMS, 5))
    dense_targets = torch.zeros_like(seq)
    dense_targets[:, 0] = nxt
    grads = []
    outs = []
    for targets, tgt in (("all", dense_targets), ("last", nxt)):
        step = _step(name, targets, *extra)
        out = step.loss(seq, lengths, tgt, *_negatives(step), torch.zeros(()))
        out.loss.backward()
        outs.append(out.loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in step.model.parameters() if p.grad is not None]))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("name, regularisers", WITH_REGULARISERS)
def test_padding_positions_get_no_gradient_and_do_not_change_the_loss(name, regularisers):
    step = _step(name, "all", "train.full_softmax=false", *regularisers)  # sampled: padding-only items are no negatives
    rng = np.random.default_rng(2)
    seq = torch.from_numpy(rng.integers(1, NUM_ITEMS - 5, (4, MAX_LEN)))
    lengths = torch.tensor([7, 3, 1, 5])
    targets = torch.from_numpy(rng.integers(1, NUM_ITEMS - 5, (4, MAX_LEN)))
    pad = torch.arange(MAX_LEN)[None, :] >= lengths[:, None]
    targets[pad] = 0
    seq[pad] = NUM_ITEMS - 1  # an item that appears only at padded positions
    negatives = torch.arange(1, NUM_ITEMS - 5)  # the padding-only items are never negatives
    out = step.loss(seq, lengths, targets, negatives, torch.empty(0), torch.zeros(()))
    out.loss.backward()
    table = step.model.item_embeddings()
    assert table.grad[NUM_ITEMS - 5 :].abs().max() == 0  # only seen at padding: no gradient
    step.model.zero_grad()
    seq2 = seq.clone()
    seq2[pad] = NUM_ITEMS - 2
    out2 = step.loss(seq2, lengths, targets, negatives, torch.empty(0), torch.zeros(()))
    torch.testing.assert_close(out.loss, out2.loss)


@pytest.mark.parametrize("name", [n for n in DENSE if spec_for(n).multi_interest])
def test_the_interest_regulariser_reads_the_prefixes_of_clicks_not_padding(name):
    rng = np.random.default_rng(4)
    seq = torch.from_numpy(rng.integers(1, NUM_ITEMS, (4, MAX_LEN)))
    lengths = torch.tensor([7, 3, 1, 5])
    targets = torch.from_numpy(rng.integers(1, NUM_ITEMS, (4, MAX_LEN)))
    targets[torch.arange(MAX_LEN)[None, :] >= lengths[:, None]] = 0
    losses = []
    for weight in (0, 1):
        step = _step(name, "all", "train.full_softmax=true", f"train.interest_reg={weight}", "train.interest_margin=-1")
        step.model.eval()  # no dropout: the two losses see the same interests
        losses.append(step.loss(seq, lengths, targets, *_negatives(step), torch.zeros(())).loss)
    with torch.no_grad():
        prefix = step.model.prefix_interests(seq, lengths)  # [B, L, K, d]
    valid = torch.arange(MAX_LEN)[None, :] < lengths[:, None]
    torch.testing.assert_close(losses[1] - losses[0], interest_cosine(prefix[valid], margin=-1.0))


@pytest.mark.parametrize(
    "name, positions",
    [(n, ["model.positions=absolute"] if "positions" in spec_for(n).settings else []) for n in DENSE]
    + [("comirec_sa", ["model.positions=alibi"])],
)
def test_prefix_interests_equal_interests_of_each_cut_sequence(name, positions):
    """``prefix_interests[:, t]`` is ``interests`` of the sequence cut after click t (positions counted from
    the start, so the reference point is the same), and the last valid prefix always equals ``interests``."""
    step = _step(name, "all", *positions)
    model = step.model.eval()
    rng = np.random.default_rng(3)
    seq = torch.from_numpy(rng.integers(1, NUM_ITEMS, (3, MAX_LEN)))
    lengths = torch.tensor([7, 4, 0])
    with torch.no_grad():
        prefix = model.prefix_interests(seq, lengths)  # [B, L, K, d]
        assert prefix.shape[:2] == (3, MAX_LEN) and torch.isfinite(prefix).all()
        for t in range(MAX_LEN):
            cut = torch.clamp(lengths, max=t + 1)
            full = model.interests(seq, cut)
            valid = lengths > t
            torch.testing.assert_close(prefix[valid, t], full[valid], atol=1e-5, rtol=1e-4)
            assert (prefix[~valid, t] == 0).all()


@pytest.mark.parametrize(
    "name, positions",
    [("sasrec", "recent"), ("comirec_sa", "recent"), ("comirec_sa", "alibi"), ("sasrec_mi", "recent")],
)
def test_last_prefix_equals_interests(name, positions):
    model = _step(name, "all", f"model.positions={positions}").model.eval()
    seq = torch.from_numpy(np.random.default_rng(4).integers(1, NUM_ITEMS, (3, MAX_LEN)))
    lengths = torch.tensor([7, 4, 2])
    with torch.no_grad():
        prefix = model.prefix_interests(seq, lengths)
        last = prefix[torch.arange(3), lengths - 1]
        torch.testing.assert_close(last, model.interests(seq, lengths), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(set(model_names()) - set(DENSE)))
def test_models_that_cannot_train_densely_are_refused_by_name(name):
    with pytest.raises(ConfigError, match=f'train.predict_at="all": {name} cannot train on every position'):
        resolved(load_config(None, [f"model.name={name}", "train.predict_at=all"]))
    assert resolved(load_config(None, [f"model.name={name}"])).train.predict_at == "last"


def test_the_attention_regulariser_is_refused_with_dense_training():
    with pytest.raises(ConfigError, match=r'train.attention_reg=1: .*dense training \(train.predict_at="all"\)'):
        resolved(load_config(None, ["model.name=comirec_sa", "train.predict_at=all", "train.attention_reg=1"]))
    assert resolved(load_config(None, ["model.name=comirec_sa", "train.attention_reg=1"])).train.attention_reg == 1


def test_window_sampler_windows_are_contiguous_and_shifted_by_one():
    lengths = np.array([2, 5, 30, 9])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.arange(1, indptr[-1] + 1)  # item ids = position + 1: contiguity is visible
    sampler = WindowSampler(indptr, items, max_len=6, seed=0, tiled=False)
    seq, lens, targets = sampler.sample(500)
    assert ((lens >= 1) & (lens <= 6)).all()
    for s, n, t in zip(seq, lens, targets):
        assert (np.diff(s[:n]) == 1).all() and (t[:n] == s[:n] + 1).all()
        assert (s[n:] == 0).all() and (t[n:] == 0).all()
    # the plan's expected targets a window matches what the draws give
    assert sampler.mean_targets() == pytest.approx(lens.mean(), rel=0.1)
    exact = np.mean([np.mean([min(e - 1, 6) for e in range(2, n + 1)]) for n in lengths])
    assert sampler.mean_targets() == pytest.approx(exact)


def test_tiled_windows_make_each_click_a_target_exactly_once_per_tiling():
    """train.windows = "tiled": a user's windows end at n, n - L, n - 2L, ... (>= 2), so their
    targets partition clicks 1..n-1; a user with at most L + 1 clicks always gets the whole
    sequence, and the draws are uniform over a user's tiles."""
    lengths = np.array([2, 3, 7, 8, 9, 16, 30])
    max_len = 7
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.arange(1, indptr[-1] + 1)  # item ids = position + 1
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    sampler = WindowSampler(indptr, items, max_len=max_len, seed=3)
    seq, lens, targets = sampler.sample(4000)
    seen: dict[int, dict[int, tuple[int, ...]]] = {}  # row -> window end -> its targets
    for s, n, t in zip(seq, lens, targets):
        assert (np.diff(s[:n]) == 1).all() and (t[:n] == s[:n] + 1).all() and (t[n:] == 0).all()
        row = int(row_of[s[0] - 1])
        end = int(t[n - 1] - indptr[row])  # the window's end in its row: its last target's position + 1
        seen.setdefault(row, {})[end] = tuple(int(x - 1 - indptr[row]) for x in t[:n])
    for row, n in enumerate(lengths):
        ends = sorted(seen[row])
        assert ends == sorted(range(n, 1, -max_len)), (n, ends)  # n, n - L, ... >= 2
        covered = sorted(p for tile in seen[row].values() for p in tile)
        assert covered == list(range(1, n)), n  # every click but the first, once
    short = lengths <= max_len + 1
    assert all(len(seen[r]) == 1 for r in np.flatnonzero(short))
    # uniform over a user's tiles: the 30-click row has 5 tiles, each about a fifth of its draws
    ends_30 = [int(t[n - 1]) for s, n, t in zip(seq, lens, targets) if row_of[s[0] - 1] == 6]
    _, counts = np.unique(ends_30, return_counts=True)
    assert len(counts) == 5 and counts.min() > 0.6 * counts.mean()
    assert sampler.mean_targets() == pytest.approx(lens.mean(), rel=0.05)
    exact = np.mean([(n - 1) / ((n - 2) // max_len + 1) for n in lengths])
    assert sampler.mean_targets() == pytest.approx(exact)


def test_saved_runs_without_windows_keep_random_windows():
    from recsys.run.saved_config import run_config_from_dict

    assert run_config_from_dict({"config_version": 2, "train": {}}).train.windows == "random"
    assert load_config(None, []).train.windows == "tiled"
    with pytest.raises(ConfigError, match="train.windows"):
        load_config(None, ["train.windows=sometimes"])


def test_a_window_horizon_reaches_past_the_window_to_the_row_end():
    lengths = np.array([2, 5, 30, 9])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.arange(1, indptr[-1] + 1)  # item ids = position + 1
    row_end = np.repeat(indptr[1:], lengths)  # [nnz] each click's row end (exclusive), as an id bound
    one = WindowSampler(indptr, items, max_len=6, seed=1).sample(300)
    seq, lens, targets = WindowSampler(indptr, items, max_len=6, seed=1, predict_next=3).sample(300)
    np.testing.assert_array_equal(seq, one[0])
    assert targets.shape == (300, 6, 3)
    np.testing.assert_array_equal(targets[..., 0], one[2])
    for s, n, t in zip(seq, lens, targets):
        for pos in range(6):
            want = [] if pos >= n else [c for c in range(s[pos] + 1, s[pos] + 4) if c <= row_end[s[pos] - 1]]
            assert t[pos].tolist() == want + [0] * (3 - len(want))


@pytest.mark.parametrize("name, targets", [("comirec_sa", "last"), ("sasrec_mi", "last"), ("sasrec", "all")])
@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_a_horizon_is_the_mean_over_its_clicks_and_skips_missing_ones(name, targets, loss):
    """Horizon m: the loss is the mean over every (position, following click) pair, as if each pair were
    its own row; a missing click (0, past the sequence's end) changes neither loss nor gradients."""
    # the interests' cosine hinge is a term per row, not per pair: off, so the loss is the pairs' mean alone
    extra = [f"train.full_softmax={str(loss == 'full').lower()}", "train.soft_readout_steps=0", "train.interest_reg=0"]
    rng = np.random.default_rng(6)
    seq = torch.from_numpy(rng.integers(1, NUM_ITEMS, (4, MAX_LEN)))
    lengths = torch.tensor([7, 3, 1, 5])
    dense = targets == "all"
    shape = (4, MAX_LEN, 3) if dense else (4, 3)
    follow = torch.from_numpy(rng.integers(1, NUM_ITEMS, shape))
    follow[1, ..., 2] = 0  # row 1's sequence ends one click early
    if dense:
        follow[torch.arange(MAX_LEN)[None, :] >= lengths[:, None]] = 0
    results = []
    for horizon, tgt in (("3", follow), ("4", torch.cat([follow, torch.zeros_like(follow[..., :1])], -1))):
        step = _step(name, targets, *extra, f"train.predict_next={horizon}")
        out = step.loss(seq, lengths, tgt, *_negatives(step), torch.zeros(()))
        out.loss.backward()
        grads = torch.cat([p.grad.flatten() for p in step.model.parameters() if p.grad is not None])
        results.append((out.loss.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    # one pair per row at horizon 1: the same mean over the valid pairs, each pair's loss on its own
    step = _step(name, targets, *extra, "train.predict_next=1")
    negatives = _negatives(step)
    per_pair, count = 0.0, 0
    for j in range(3):
        column = follow[..., j]
        rows = (column > 0).sum() if dense else (column > 0).nonzero().flatten()
        if dense:
            out = step.loss(seq, lengths, column, *negatives, torch.zeros(()))
            per_pair, count = per_pair + out.loss.detach() * rows, count + rows
        else:
            out = step.loss(seq[rows], lengths[rows], column[rows], *negatives, torch.zeros(()))
            per_pair, count = per_pair + out.loss.detach() * len(rows), count + len(rows)
    torch.testing.assert_close(results[0][0], per_pair / count)


def test_the_automatic_horizon_follows_the_share_of_tied_timestamps():
    with pytest.raises(ConfigError, match=r"train.predict_next: must be >= 1 \(or -1: automatic\), got 0"):
        load_config(None, ["train.predict_next=0"])
    assert (
        resolved(load_config(None, ["model.name=mind", "train.predict_next=5"]), tied_share=0.0).train.predict_next == 5
    )
    for name in ("comirec_sa", "sasrec_mi"):
        cfg = load_config(None, [f"model.name={name}"])
        assert resolved(cfg, tied_share=0.0).train.predict_next == 1
        assert resolved(cfg, tied_share=0.25).train.predict_next == 5
        assert resolved(cfg, tied_share=0.2).train.predict_next == 1
        assert resolved(cfg, tied_share=0.51).train.predict_next == 5
    for name in ("sasrec", "gru4rec", "mind", "comirec_dr"):  # no measured gain: the next click
        assert resolved(load_config(None, [f"model.name={name}"]), tied_share=1.0).train.predict_next == 1
    cfg = resolved(load_config(None, ["model.name=comirec_sa", "model.dim=16", "model.backend=torch"]), NUM_ITEMS)
    cfg = copy.deepcopy(cfg)  # a copy of a resolved config is a plain one, to change
    cfg.train.predict_next = -1  # as if written back after resolving
    model = build_model(cfg.model, NUM_ITEMS, MAX_LEN)
    with pytest.raises(ValueError, match=r"TrainStep: train.predict_next still automatic; resolve the config"):
        TrainStep(model, cfg, torch.device("cpu"), torch.ones(NUM_ITEMS), torch.Generator())


def test_tied_share_counts_equal_times_within_a_user_only():
    from recsys.data.prepare import Dataset

    def dataset(lengths, times):
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        n = int(indptr[-1])
        return Dataset(
            item_raw=np.array(["<pad>", "a"]),
            user_raw=np.array([str(u) for u in range(len(lengths))]),
            indptr=indptr,
            items=np.ones(n, dtype=np.int64),
            times=None if times is None else np.array(times, dtype=np.float64),
            item_category=np.zeros(2, dtype=np.int64),
            category_raw=np.array(["<unknown>"]),
            item_counts=np.array([0, n]),
        )

    for block in (1, 2, 1 << 24):  # blocks of any size count the same pairs
        # users [5, 5, 6] | [] | [6, 7] | []: pairs (5, 5) (5, 6) (6, 7); the 6 -> 6 across users is no pair
        assert dataset([3, 0, 2, 0], [5, 5, 6, 6, 7]).tied_share(block) == pytest.approx(1 / 3)
        assert dataset([0, 3], [1, 1, 1]).tied_share(block) == 1.0
        assert dataset([1, 1], [4, 4]).tied_share(block) == 0.0
        assert dataset([3], None).tied_share(block) == 0.0
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, 50)
    times = rng.integers(0, 3, int(lengths.sum())).astype(np.float64)
    rows = np.split(times, np.cumsum(lengths)[:-1])  # each user's times, counted one by one
    expected = sum(int((row[1:] == row[:-1]).sum()) for row in rows) / sum(max(len(row) - 1, 0) for row in rows)
    assert 0 < expected < 1
    assert dataset(lengths, times).tied_share(block=3) == pytest.approx(expected)


def test_runs_saved_before_dense_training_load_as_trained(tiny_run, tmp_path):
    """A config.json without train.predict_at was trained on the last position: it loads and evaluates so,
    even for a model whose automatic value is now "all"."""
    import json
    import shutil

    from recsys.config import Config
    from recsys.run.saved_config import run_config_from_dict

    saved = Config().to_dict()
    saved["model"]["name"] = "sasrec"
    del saved["train"]["predict_at"]
    assert run_config_from_dict(saved).train.predict_at == "last"
    assert resolved(load_config(None, ["model.name=sasrec"])).train.predict_at == "all"

    import recsys
    from recsys.io import manifest

    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    path = old / "config.json"
    values = json.loads(path.read_text())
    del values["train"]["predict_at"]
    path.write_text(json.dumps(values))
    manifest.record(old, path)  # an old run's manifest matched its config
    run = recsys.Run.load(old)
    assert run.config.train.predict_at == "last"
    assert run.evaluate("test") == recsys.Run.load(tiny_run).evaluate("test")


def test_the_memory_estimate_counts_a_target_at_every_position():
    from recsys.train.memory import estimate_bytes

    last = resolved(load_config(None, ["model.name=sasrec", "train.predict_at=last", "data.max_len=50"]), 50_001)
    dense = resolved(load_config(None, ["model.name=sasrec", "data.max_len=50"]), 50_001)
    parts = [estimate_bytes(cfg, 10_000, 50_001, 1)["training step activations"] for cfg in (last, dense)]
    # 49 more positions of logits over the 1,280 shared negatives (and their gradients), 4 bytes each
    assert parts[1] - parts[0] >= 2 * 128 * 49 * 1281 * 4


def test_the_memory_estimate_counts_every_following_click():
    from recsys.train.memory import estimate_bytes

    one, five = (
        estimate_bytes(
            resolved(load_config(None, ["model.name=comirec_sa", f"train.predict_next={h}"]), 50_001), 10_000, 50_001, 4
        )
        for h in (1, 5)
    )
    # four more rows a history of logits over the 1,280 shared negatives (and their gradients), 4 bytes each
    assert five["training step activations"] - one["training step activations"] >= 2 * 128 * 4 * 1281 * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "name, targets, horizon, extra",
    [
        ("sasrec", "all", 1, ["train.full_softmax=false"]),
        ("comirec_sa", "all", 1, ["model.positions=alibi"]),
        ("sasrec_mi", "all", 1, []),
        ("sasrec", "all", 1, ["train.full_softmax=true"]),
        ("sasrec", "all", 3, ["train.full_softmax=true"]),
        ("comirec_sa", "last", 5, []),
    ],
)
def test_the_captured_step_follows_the_eager_step(name, targets, horizon, extra):
    """Dense and multi-click training under a CUDA graph (bf16, Triton kernels) train as the eager step does."""
    cuda = torch.device("cuda")
    sampler_data = np.random.default_rng(5)
    lengths = sampler_data.integers(2, 60, 400)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = sampler_data.integers(1, 500, indptr[-1])
    draws = (
        WindowSampler(indptr, items, 50, seed=0, predict_next=horizon)
        if targets == "all"
        else TrainSampler(indptr, items, 50, seed=0, predict_next=horizon)
    )
    batches = [tuple(torch.from_numpy(x).to(cuda) for x in draws.sample(128)) for _ in range(6)]
    losses = {}
    for graph in ("false", "true"):
        cfg = resolved(
            load_config(
                None,
                [
                    f"model.name={name}",
                    f"train.predict_at={targets}",
                    f"train.predict_next={horizon}",
                    "data.max_len=50",
                    "model.dropout=0",
                    "train.batch_size=128",
                    f"train.cuda_graph={graph}",
                    *extra,
                ],
            ),
            500,
            device="cuda",  # the exact softmax on its fused kernel (recsys.run.settings.fused_exact_softmax)
        )
        torch.manual_seed(0)
        model = build_model(cfg.model, 500, 50).to(cuda)
        step = TrainStep(
            model,
            cfg,
            cuda,
            torch.ones(500, dtype=torch.long, device=cuda),
            torch.Generator(device=cuda).manual_seed(0),
        )
        losses[graph] = [step(*b, step=i)[0].loss.item() for i, b in enumerate(batches)]
        assert (step.graph is not None) == (graph == "true")
    assert all(np.isfinite(losses["true"]))
    assert losses["true"] == pytest.approx(losses["false"], rel=2e-2)
