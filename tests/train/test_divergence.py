"""Divergence: a run whose loss or gradients blow up stops with one line and exit status 2,
keeping the checkpoint of its last validation before the divergence."""

import math

import pytest
import torch

from recsys.cli import main
from recsys.config import TrainConfig, load_config
from recsys.run import RunDir
from recsys.train.divergence import LOSS_FACTOR, DivergenceGuard, TrainingDiverged

from conftest import TINY_RUN_OVERRIDES

TINY_DATA = [a for o in TINY_RUN_OVERRIDES if not o.startswith(("name=", "train.")) for a in ("--set", o)]
TINY_TRAIN = ["--set", "train.batch_size=32", "--set", "train.lr=0.001", "--set", "train.num_negatives=64"]


def _guard(tmp_path, start: float = 4.0, **train) -> DivergenceGuard:
    guard = DivergenceGuard(TrainConfig(**train), RunDir(tmp_path), torch.device("cpu"))
    guard.watch(torch.tensor(start))
    guard.watch(torch.tensor(1e6))  # only the first step's loss is the start
    return guard


def test_a_finite_loss_near_its_start_passes(tmp_path):
    guard = _guard(tmp_path)
    guard.check(100, 3.5, 2.0)
    guard.check(200, LOSS_FACTOR * 4.0 - 1, 2.0)  # a spike, not a divergence
    assert guard.state() == {"start_loss": 4.0}


@pytest.mark.parametrize(
    "loss, grad_norm, what",
    [
        (math.nan, 1.0, "the loss is nan"),
        (math.inf, 1.0, "the loss is inf"),
        (3.0, math.inf, "the gradient norm is inf"),
        (3.0, math.nan, "the gradient norm is nan"),
        (LOSS_FACTOR * 4.0 + 1, 1.0, "the loss rose to 41, over 10 times its start (4)"),
    ],
)
def test_non_finite_or_runaway_values_stop_the_run(tmp_path, loss, grad_norm, what):
    with pytest.raises(TrainingDiverged) as caught:
        _guard(tmp_path, lr=0.5).check(300, loss, grad_norm)
    message = str(caught.value)
    assert message.startswith(f"training diverged at step 300: {what}; lower train.lr (now 0.5)")
    assert message.endswith("no checkpoint had been written yet")


def test_the_advice_names_unclipped_gradients_and_the_kept_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint({"step": 20})
    with pytest.raises(
        TrainingDiverged,
        match=r"train.grad_clip = 0 leaves the gradients unclipped; "
        rf"{tmp_path} keeps the checkpoint",
    ):
        _guard(tmp_path, grad_clip=0.0).check(40, math.nan, 0.0)


def test_a_resumed_run_keeps_the_start_of_the_uninterrupted_one(tmp_path):
    guard = DivergenceGuard(TrainConfig(), RunDir(tmp_path), torch.device("cpu"), start_loss=4.0)
    guard.watch(torch.tensor(0.5))  # the resumed run's first step is far lower
    guard.check(500, 5.0, 1.0)  # 10 x 0.5 would have stopped it
    assert guard.state() == {"start_loss": 4.0}


def test_a_rate_that_is_not_positive_is_refused(capsys):
    """A negative rate other than -1 (the model's) is an error naming the key; so is 0, which once
    meant "follow the batch" and now says so."""
    assert main(["train", "--set", "train.lr=-0.001"]) == 2
    assert "train.lr: must be > 0 (or -1: the model's rate), got -0.001\n" in capsys.readouterr().err
    assert main(["train", "--set", "train.lr=0"]) == 2
    assert (
        "train.lr: must be > 0 (or -1: the model's rate), got 0.0 (0 no longer means automatic"
        in capsys.readouterr().err
    )


def test_a_huge_learning_rate_stops_with_exit_status_2(tmp_path, capsys):
    """Was: trained to loss 2.5e22 with infinite gradient norms and reported its metrics."""
    code = main(
        [
            "train",
            *TINY_DATA,
            *TINY_TRAIN,
            "--set",
            "train.lr=1e10",
            "--set",
            "train.max_steps=60",
            "--set",
            "train.eval_every=20",
            "--set",
            "train.log_every=10",
            "--set",
            f"output_dir={tmp_path}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "error: training diverged at step 10:" in err and "lower train.lr (now 1e+10)" in err
    assert not any(tmp_path.iterdir())  # it diverged before its first checkpoint: nothing to keep


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    """The loss turns NaN after step 25: the checkpoint of step 20 stays and still evaluates."""
    from recsys.train.step import TrainStep

    real_call = TrainStep.__call__

    def poisoned(self, *batch, step=0):
        out, grad_norm = real_call(self, *batch, step=step)
        if step >= 25:
            out.loss.data.fill_(math.nan)
        return out, grad_norm

    monkeypatch.setattr(TrainStep, "__call__", poisoned)
    run = tmp_path / "run"
    code = main(
        [
            "train",
            *TINY_DATA,
            *TINY_TRAIN,
            "--set",
            "train.max_steps=60",
            "--set",
            "train.eval_every=20",
            "--set",
            f"output_dir={tmp_path}",
            "--set",
            "name=run",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"training diverged at step 40: the loss is nan; lower train.lr (now 0.001); {run} keeps" in err
    checkpoint = RunDir(run).load_checkpoint()
    assert checkpoint["step"] == 20 and checkpoint["start_loss"] > 0
    assert max(r["step"] for r in RunDir(run).read_metrics()) == 20  # no row of the diverged window
    monkeypatch.undo()
    assert main(["evaluate", str(run)]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_divergence_is_caught_under_cuda_graphs(tmp_path):
    from recsys.train.trainer import train

    cfg = load_config(
        None,
        TINY_RUN_OVERRIDES
        + [
            "train.lr=1e10",
            "train.max_steps=60",
            "train.log_every=10",
            "train.cuda_graph=true",
            "train.device=cuda",
            f"output_dir={tmp_path}",
        ],
    )
    with pytest.raises(TrainingDiverged, match="training diverged at step 10"):
        train(cfg, log=lambda line: None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", ["true", "false"])
def test_the_guard_adds_no_sync_between_log_lines(tmp_path, count_syncs, graph):
    """A run's syncs do not grow with its steps between two log lines: the guard keeps the first
    loss on the device and reads only what the log line reads."""
    from recsys.train.trainer import train

    def syncs(steps: int) -> int:
        cfg = load_config(
            None,
            TINY_RUN_OVERRIDES
            + [
                f"train.max_steps={steps}",
                f"train.eval_every={steps}",
                f"train.log_every={steps}",
                "train.device=cuda",
                f"train.cuda_graph={graph}",
                f"output_dir={tmp_path / str(steps)}",
            ],
        )
        return count_syncs(lambda: train(cfg, log=lambda line: None))

    assert syncs(40) == syncs(80)
