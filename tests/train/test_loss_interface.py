"""The loss seam: the step reaches its loss through train.loss's registry only; BPR, the worked
example of adding one, against a loop in fp64; a loss registered in a test trains."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from recsys.config import ConfigError, load_config
from recsys.train.losses import CatalogueLoss, LossRows, loss_names, make_loss, register_loss
from recsys.train.losses.bpr import BPR
from recsys.train.losses.catalogue import _LOSSES
from recsys.train.losses.softmax import ExactSoftmax, SampledSoftmax
from recsys.train.trainer import train
from tests.conftest import TINY_RUN_OVERRIDES

STEP = Path(__file__).resolve().parents[2] / "recsys" / "train" / "step.py"


def _config(*extra: str):
    from recsys.run.settings import Facts, resolve

    cfg = load_config(None, ["model.name=youtube_dnn", "model.dim=8", "train.num_negatives=6", *extra])
    return resolve(cfg, Facts.of_lengths([9] * 50, num_items=30))


def test_the_step_reaches_losses_only_through_the_registry():
    """No softmax, sampler or pairwise loss is named in the training step: it builds train.loss with make_loss."""
    names = set()
    for node in ast.walk(ast.parse(STEP.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("recsys.train.losses"):
            names |= {alias.name for alias in node.names}
    assert "make_loss" in names
    named = {n for n in names - {"make_loss"} if n.endswith("_loss") or "ampler" in n}
    assert not named | (names & {"draw_from", "negative_logits", "mixture_log_expected_count"})


def test_the_softmax_is_exact_or_sampled_as_full_softmax_says():
    counts, gen = torch.ones(30, dtype=torch.long), torch.Generator()
    assert isinstance(make_loss(_config("train.full_softmax=true"), counts, torch.device("cpu"), gen), ExactSoftmax)
    assert isinstance(make_loss(_config("train.full_softmax=false"), counts, torch.device("cpu"), gen), SampledSoftmax)
    bpr = _config("train.loss=bpr")
    assert bpr.train.full_softmax is False and isinstance(make_loss(bpr, counts, torch.device("cpu"), gen), BPR)
    assert {"softmax", "bpr"} <= set(loss_names())


def test_bpr_matches_a_loop_in_double_precision():
    torch.manual_seed(0)
    loss = BPR(
        _config("train.loss=bpr", "model.backend=torch"),
        torch.ones(30, dtype=torch.long),
        torch.device("cpu"),
        torch.Generator(),
    )
    user, items = torch.randn(5, 8, dtype=torch.float64), torch.randn(30, 8, dtype=torch.float64)
    targets = torch.tensor([3, 7, 7, 0, 12])
    mask = torch.tensor([True, True, True, False, True])
    negatives = torch.tensor([7, 2, 9, 12, 20, 7])  # 7 and 12 collide with targets: left out of those rows
    rows = LossRows(user, targets, items, None, user[:, None], mask=mask, count=None)
    out = loss(rows, negatives, torch.empty(0))
    expected = []
    for r in range(5):
        if not mask[r]:
            continue
        pos = float(user[r] @ items[targets[r]])
        pairs = [math.log1p(math.exp(float(user[r] @ items[j]) - pos)) for j in negatives.tolist() if j != targets[r]]
        expected.append(sum(pairs) / len(pairs))
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-6)  # logits in fp32, as the softmax
    user.requires_grad_(True)
    out = loss(LossRows(user, targets, items, None, user[:, None], mask=mask, count=None), negatives, torch.empty(0))
    out.loss.backward()
    assert user.grad[3].abs().max() == 0 and torch.isfinite(user.grad).all()  # a masked row gets no gradient


def test_bpr_and_the_exact_softmax_cannot_be_combined():
    with pytest.raises(ConfigError, match='train.full_softmax = true: applies to train.loss = "softmax"'):
        _config("train.loss=bpr", "train.full_softmax=true")


def test_an_unknown_loss_names_the_known_ones(tmp_path):
    cfg = load_config(None, [*TINY_RUN_OVERRIDES, f"output_dir={tmp_path}", "train.loss=hinge"])
    with pytest.raises(ConfigError, match="train.loss: unknown loss 'hinge'; known: bpr, softmax"):
        train(cfg, log=lambda line: None)


class _MeanSquared(CatalogueLoss):
    """A toy loss registered by the test: the squared error of the target's score to 1."""

    def __init__(self, device: torch.device):
        self.device = device

    def draw(self):
        return torch.empty(0, dtype=torch.long, device=self.device), torch.empty(0, device=self.device)

    def __call__(self, rows, negatives, hard_uniforms):
        from recsys.train.losses import LossOutput

        score = (rows.user * rows.item_emb[rows.targets]).sum(dim=1).float()
        per_row = (score - 1).square()
        loss = per_row.mean() if rows.mask is None else per_row[rows.mask].mean()
        return LossOutput(loss=loss, log_z=score.detach().mean(), max_logit=score.detach().max())


def test_a_registered_loss_trains_a_run(tmp_path):
    register_loss("mean_squared", lambda cfg, counts, device, generator: _MeanSquared(device))
    try:
        for model in ("comirec_sa", "sasrec"):  # last-position and dense training
            cfg = load_config(
                None,
                [
                    *TINY_RUN_OVERRIDES,
                    f"output_dir={tmp_path / model}",
                    f"model.name={model}",
                    "train.loss=mean_squared",
                ],
            )
            result = train(cfg, log=lambda line: None)
            assert math.isfinite(result.test_metrics["recall@10"])
            assert json_loss(result.run_dir) == "mean_squared"
    finally:
        _LOSSES.pop("mean_squared")


def json_loss(run_dir: Path) -> str:
    import json

    return json.loads((Path(run_dir) / "config.json").read_text())["train"]["loss"]


def test_bpr_trains_a_run(tmp_path):
    cfg = load_config(None, [*TINY_RUN_OVERRIDES, f"output_dir={tmp_path}", "train.loss=bpr"])
    result = train(cfg, log=lambda line: None)
    assert math.isfinite(result.test_metrics["recall@10"])


def test_the_training_guides_own_loss_example_registers_and_trains(tmp_path):
    """docs/training.md, "Your own loss": its snippet, run as written, then a run with train.loss=hinge."""
    guide = (STEP.parents[2] / "docs" / "training.md").read_text()
    section = guide.split("### Your own loss", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "docs/training.md", "exec"), {})
    try:
        cfg = load_config(None, [*TINY_RUN_OVERRIDES, f"output_dir={tmp_path}", "train.loss=hinge"])
        assert math.isfinite(train(cfg, log=lambda line: None).test_metrics["recall@10"])
    finally:
        _LOSSES.pop("hinge")


def test_a_state_interest_is_read_out_against_every_target_by_itself():
    """next_mi's readouts: interest 0 alone (negatives scored by it), ComiRec's readout over the rest."""
    from recsys.train.losses import readout, readouts

    torch.manual_seed(0)
    interests, target = torch.randn(6, 4, 8, requires_grad=True), torch.randn(6, 8)
    plain = readouts(interests, target, max_scores=True)
    assert len(plain) == 1 and plain[0][1] is interests
    torch.testing.assert_close(plain[0][0], readout(interests, target))
    (state, by_state), (rest, by_rest) = readouts(interests, target, max_scores=True, state_interest=True)
    torch.testing.assert_close(state, interests[:, 0])
    torch.testing.assert_close(rest, readout(interests[:, 1:], target))
    assert by_state is None and by_rest.shape == (6, 3, 8)
    (state.sum() + 0 * rest.sum()).backward()
    assert interests.grad[:, 0].abs().min() > 0 and interests.grad[:, 1:].abs().max() == 0


def test_next_mi_trains_its_state_on_every_target(tmp_path):
    """In a dense step of next_mi (causal attention blocks), interest 0 gets a gradient from every row,
    whatever the readout picks."""
    from recsys.models import build_model
    from recsys.run.settings import Facts, resolve
    from recsys.train.step import TrainStep

    cfg = resolve(
        load_config(
            None,
            # the head's gradient from the readout alone: no max-scored negatives, hinge or soft readout
            ["model.name=next_mi", "model.dim=8", "model.backend=torch", "train.negative_readout=readout"]
            + ["train.interest_reg=0", "train.soft_readout_steps=0", "model.mixer=attention", "train.predict_at=all"],
        ),
        Facts.of_lengths([9] * 50, num_items=30),
    )
    assert cfg.train.predict_at == "all"
    torch.manual_seed(0)
    model = build_model(cfg.model, 30, cfg.data.max_len)
    step = TrainStep(model, cfg, torch.device("cpu"), torch.ones(30, dtype=torch.long), torch.Generator())
    assert step.state_interest
    seq = torch.randint(1, 30, (4, cfg.data.max_len))
    lengths = torch.tensor([cfg.data.max_len, 5, 2, 1])
    targets = torch.where(torch.arange(cfg.data.max_len) < lengths[:, None] - 1, torch.randint(1, 30, seq.shape), 0)
    seen = {}
    real = model.encode_prefix

    def spy(h, lengths):
        out = real(h, lengths)
        out.retain_grad()
        seen["prefix"] = out
        return out

    model.encode_prefix = spy
    out = step.loss(seq, lengths, targets, *step.negatives(), torch.zeros(()))
    out.loss.backward()
    grad = seen["prefix"].grad  # [B, L, K, d]
    valid = targets > 0
    assert (grad[:, :, 0].abs().sum(-1)[valid] > 0).all()  # the state: every target row
    picked = (grad[:, :, 1:].abs().sum(-1) > 0)[valid]  # the head: one interest a row (the readout's)
    assert (picked.sum(-1) == 1).all()
