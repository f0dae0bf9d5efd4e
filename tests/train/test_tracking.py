"""TensorBoard mirroring of metrics.jsonl (train.tensorboard) and the trainer's per-validation hook."""

import math

import pytest

from recsys.config import load_config
from recsys.run import RunDir
from recsys.train.tracking import scalars
from recsys.train.trainer import train

from conftest import TINY_RUN_OVERRIDES

pytest.importorskip("tensorboard")


def _cfg(tmp_path, *extra):
    return load_config(
        None, TINY_RUN_OVERRIDES + ["train.log_every=5", "train.eval_every=10", f"output_dir={tmp_path}", *extra]
    )


def _read_events(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_hold_every_metrics_scalar(tmp_path):
    result = train(_cfg(tmp_path, "train.tensorboard=true"), log=lambda s: None)
    run = RunDir(result.run_dir)
    records = run.read_metrics()
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in scalars(record).items():
            expected.setdefault(tag, []).append((record["step"], value))
    assert {"train/loss", "valid/recall@50", "valid/mi_eff_clicks"} <= set(expected)
    assert len(expected["train/loss"]) == 4 and len(expected["valid/recall@50"]) == 2

    events = _read_events(run.tensorboard_dir())
    assert set(events) == set(expected)
    for tag, points in expected.items():
        assert [s for s, _ in events[tag]] == [s for s, _ in points], tag
        for (_, got), (_, want) in zip(events[tag], points):
            assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6), (tag, got, want)  # float32 in the event file


def test_tensorboard_is_off_by_default(tmp_path):
    result = train(_cfg(tmp_path, "train.max_steps=10"), log=lambda s: None)
    assert not RunDir(result.run_dir).tensorboard_dir().exists()


def test_scalars_skip_step_split_and_non_numbers():
    assert scalars({"step": 3, "split": "valid", "recall@50": 0.5, "ok": True, "note": "x", "n": 2}) == {
        "valid/recall@50": 0.5,
        "valid/n": 2.0,
    }
    assert scalars({"step": 3, "loss": 1.25}) == {"train/loss": 1.25}


class _Stop(Exception):
    pass


def test_on_validate_sees_every_validation_and_may_stop_training(tmp_path):
    seen: list[tuple[int, float]] = []

    def hook(step: int, metrics: dict[str, float]) -> None:
        seen.append((step, metrics["recall@50"]))
        if step == 10:
            raise _Stop

    with pytest.raises(_Stop):
        train(_cfg(tmp_path, "name=stopped"), log=lambda s: None, on_validate=hook)
    run = RunDir(tmp_path / "stopped")
    valid = [r for r in run.read_metrics() if r.get("split") == "valid"]
    assert seen == [(10, valid[0]["recall@50"])] and len(valid) == 1  # written before the hook ran
    assert run.load_checkpoint()["step"] == 10

    seen.clear()
    result = train(
        _cfg(tmp_path, "name=full"), log=lambda s: None, on_validate=lambda s, m: seen.append((s, m["recall@50"]))
    )
    assert [s for s, _ in seen] == [10, 20] and max(v for _, v in seen) == result.best_valid
