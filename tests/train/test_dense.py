"""Dense training (``train.targets = "all"``): every position of a window predicts the next click."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.config import ConfigError, load_config
from recsys.data.batches import WindowSampler
from recsys.models import build_model, resolve, spec_for
from recsys.train.trainer import TrainStep

DENSE = ["sasrec", "sasrec_mi", "comirec_sa", "gru4rec", "youtube_dnn"]
NUM_ITEMS, MAX_LEN = 40, 7


def _step(name: str, targets: str, *extra: str) -> TrainStep:
    cfg = resolve(
        load_config(
            None,
            [
                f"model.name={name}",
                f"train.targets={targets}",
                "model.dim=16",
                "model.num_heads=2",
                "model.dropout=0",
                "model.backend=torch",
                "model.num_interests=3",
                "train.num_negatives=12",
                "train.attention_reg=0",  # last-position only: dense training does not compute it
                *extra,
            ],
        )
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, NUM_ITEMS, MAX_LEN)
    counts = torch.ones(NUM_ITEMS, dtype=torch.long)
    return TrainStep(model, cfg, torch.device("cpu"), counts, torch.Generator().manual_seed(0))


def _negatives(step: TrainStep) -> tuple[torch.Tensor, torch.Tensor]:
    step.generator.manual_seed(3)
    return step.negatives()


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_a_window_of_one_target_gives_the_last_position_loss(name, loss):
    """With one input click per row, dense and last-position training compute the same loss and gradients."""
    extra = [f"train.full_softmax={str(loss == 'full').lower()}"]
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


@pytest.mark.parametrize("name", DENSE)
def test_padding_positions_get_no_gradient_and_do_not_change_the_loss(name):
    step = _step(name, "all", "train.full_softmax=false")  # sampled: the padding-only items are no negatives
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


@pytest.mark.parametrize("name", ["mind", "comirec_dr", "popular"])
def test_models_that_cannot_train_densely_are_refused_by_name(name):
    with pytest.raises(ConfigError, match=f'train.targets="all": {name} cannot train on every position'):
        resolve(load_config(None, [f"model.name={name}", "train.targets=all"]))
    assert resolve(load_config(None, [f"model.name={name}"])).train.targets == "last"


def test_the_attention_regulariser_is_refused_with_dense_training():
    with pytest.raises(ConfigError, match=r'train.attention_reg=1: .*dense training \(train.targets="all"\)'):
        resolve(load_config(None, ["model.name=comirec_sa", "train.targets=all", "train.attention_reg=1"]))
    assert resolve(load_config(None, ["model.name=comirec_sa", "train.attention_reg=1"])).train.attention_reg == 1


def test_window_sampler_windows_are_contiguous_and_shifted_by_one():
    lengths = np.array([2, 5, 30, 9])
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.arange(1, indptr[-1] + 1)  # item ids = position + 1: contiguity is visible
    sampler = WindowSampler(indptr, items, max_len=6, seed=0)
    seq, lens, targets = sampler.sample(500)
    assert ((lens >= 1) & (lens <= 6)).all()
    for s, n, t in zip(seq, lens, targets):
        assert (np.diff(s[:n]) == 1).all() and (t[:n] == s[:n] + 1).all()
        assert (s[n:] == 0).all() and (t[n:] == 0).all()
    # the plan's expected targets a window matches what the draws give
    assert sampler.mean_targets() == pytest.approx(lens.mean(), rel=0.1)
    exact = np.mean([np.mean([min(e - 1, 6) for e in range(2, n + 1)]) for n in lengths])
    assert sampler.mean_targets() == pytest.approx(exact)


def test_runs_saved_before_dense_training_load_as_trained(tiny_run, tmp_path):
    """A config.json without train.targets was trained on the last position: it loads and evaluates so,
    even for a model whose automatic value is now "all"."""
    import json
    import shutil

    from recsys.config import Config
    from recsys.run.saved_config import run_config_from_dict

    saved = Config().to_dict()
    saved["model"]["name"] = "sasrec"
    del saved["train"]["targets"]
    assert run_config_from_dict(saved).train.targets == "last"
    assert resolve(load_config(None, ["model.name=sasrec"])).train.targets == "all"

    import recsys
    from recsys.io import manifest

    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    path = old / "config.json"
    values = json.loads(path.read_text())
    del values["train"]["targets"]
    path.write_text(json.dumps(values))
    manifest.record(old, path)  # an old run's manifest matched its config
    run = recsys.Run.load(old)
    assert run.config.train.targets == "last"
    assert run.evaluate("test") == recsys.Run.load(tiny_run).evaluate("test")


def test_the_memory_estimate_counts_a_target_at_every_position():
    from recsys.train.memory import estimate_bytes

    last = resolve(load_config(None, ["model.name=sasrec", "train.targets=last", "data.max_len=50"]))
    dense = resolve(load_config(None, ["model.name=sasrec", "data.max_len=50"]))
    parts = [estimate_bytes(cfg, 10_000, 50_001, 1)["training step activations"] for cfg in (last, dense)]
    # 49 more positions of logits over the 1,280 shared negatives (and their gradients), 4 bytes each
    assert parts[1] - parts[0] >= 2 * 128 * 49 * 1281 * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "name, extra",
    [
        ("sasrec", ["train.full_softmax=false"]),
        ("comirec_sa", ["model.positions=alibi"]),
        ("sasrec_mi", []),
        ("sasrec", ["train.full_softmax=true"]),
    ],
)
def test_the_captured_dense_step_follows_the_eager_step(name, extra):
    """Dense training under a CUDA graph (bf16, Triton kernels) trains as the eager step does."""
    cuda = torch.device("cuda")
    sampler_data = np.random.default_rng(5)
    lengths = sampler_data.integers(2, 60, 400)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    windows = WindowSampler(indptr, sampler_data.integers(1, 500, indptr[-1]), 50, seed=0)
    batches = [tuple(torch.from_numpy(x).to(cuda) for x in windows.sample(128)) for _ in range(6)]
    losses = {}
    for graph in ("false", "true"):
        cfg = resolve(
            load_config(
                None,
                [
                    f"model.name={name}",
                    "train.targets=all",
                    "data.max_len=50",
                    "model.dropout=0",
                    "train.batch_size=128",
                    f"train.cuda_graph={graph}",
                    *extra,
                ],
            )
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
