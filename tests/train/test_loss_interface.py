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

TRAINER = Path(__file__).resolve().parents[2] / "recsys" / "train" / "trainer.py"


def _config(*extra: str):
    from recsys.run.settings import Facts, resolve

    cfg = load_config(None, ["model.name=youtube_dnn", "model.dim=8", "train.num_negatives=6", *extra])
    return resolve(cfg, Facts.of_lengths([9] * 50, num_items=30))


def test_the_trainer_reaches_losses_only_through_the_registry():
    """No softmax, sampler or pairwise loss is named in the trainer: it builds train.loss with make_loss."""
    names = set()
    for node in ast.walk(ast.parse(TRAINER.read_text())):
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
    guide = (TRAINER.parents[2] / "docs" / "training.md").read_text()
    section = guide.split("### Your own loss", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    exec(compile(snippet, "docs/training.md", "exec"), {})
    try:
        cfg = load_config(None, [*TINY_RUN_OVERRIDES, f"output_dir={tmp_path}", "train.loss=hinge"])
        assert math.isfinite(train(cfg, log=lambda line: None).test_metrics["recall@10"])
    finally:
        _LOSSES.pop("hinge")
