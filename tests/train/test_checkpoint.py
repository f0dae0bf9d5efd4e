"""Run directory: checkpoint round trip, atomic writes, metrics log, config, run names."""

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

from recsys.config import load_config
from recsys.io import atomic_write, check_plain
from recsys.run import RunDir, layout, new_run_dir
from recsys.train.checkpoint import capture_rng, make_checkpoint, restore_rng
from tests.conftest import resolved


def _model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer


def _train_step(model, optimizer):
    loss = model(torch.tensor([1, 2, 3])).square().sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_checkpoint_round_trip_loads_weights_only(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    _train_step(model, optimizer)
    batches = np.random.default_rng(5)
    negatives = torch.Generator().manual_seed(6)
    rng = capture_rng({"batches": batches}, {"negatives": negatives})
    state = make_checkpoint(
        model, step=7, best=0.25, best_step=5, bad_evals=1, rng=rng, optimizer=optimizer.state_dict()
    )
    run = RunDir.create(tmp_path / "run")
    run.save_checkpoint(state)
    after_save = (batches.integers(0, 10**9, 4), torch.randint(0, 10**9, (4,), generator=negatives), torch.rand(3))

    raw = torch.load(run.file(layout.CHECKPOINT), weights_only=True)  # the contract itself
    assert raw["step"] == 7 and raw["best"] == 0.25 and raw["best_step"] == 5 and raw["bad_evals"] == 1

    loaded = run.load_checkpoint()
    model2, optimizer2 = _model_and_optimizer(1)
    model2.load_state_dict(loaded["model"])
    optimizer2.load_state_dict(loaded["optimizer"])
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    _train_step(model, optimizer)
    _train_step(model2, optimizer2)  # same optimizer moments -> same update
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)

    batches2, negatives2 = np.random.default_rng(0), torch.Generator()
    restore_rng(loaded["rng"], {"batches": batches2}, {"negatives": negatives2})
    after_restore = (batches2.integers(0, 10**9, 4), torch.randint(0, 10**9, (4,), generator=negatives2), torch.rand(3))
    np.testing.assert_array_equal(after_save[0], after_restore[0])
    assert torch.equal(after_save[1], after_restore[1]) and torch.equal(after_save[2], after_restore[2])


def test_restore_rng_requires_the_same_generator_names():
    rng = capture_rng({"batches": np.random.default_rng(0)})
    with pytest.raises(KeyError, match="batches"):
        restore_rng(rng, {"other": np.random.default_rng(0)})


def test_best_and_latest(tmp_path):
    run = RunDir.create(tmp_path / "run")
    assert not run.has_checkpoint() and not run.has_best()
    with pytest.raises(FileNotFoundError, match="model.pt"):
        run.load_checkpoint()
    model, _ = _model_and_optimizer(0)
    run.save_best(model.state_dict(), step=3, metric=0.5)
    assert run.has_best()
    best = run.load_best()
    assert best.keys() == model.state_dict().keys()
    assert torch.load(run.file(layout.BEST), weights_only=True)["step"] == 3


def test_check_plain_names_the_offending_key():
    with pytest.raises(TypeError, match=r"checkpoint\['rng'\]\['x'\].*float64"):
        check_plain({"step": 1, "rng": {"x": np.float64(1.0)}})
    check_plain({"a": [1, 2.0, None, "s", (True,)], "t": torch.zeros(2), 0: {"d": torch.float32}})


def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old content")

    def crash_midway(f):
        f.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, crash_midway)
    assert path.read_bytes() == b"old content"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_checkpoint_save_failure_midway_keeps_previous(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    run.save_checkpoint({"step": 1})
    real_save = torch.save

    def failing_save(obj, f):
        real_save(obj, f)  # bytes reach the temporary file...
        raise RuntimeError("killed")  # ...then the process dies before the rename

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(RuntimeError, match="killed"):
        run.save_checkpoint({"step": 2})
    monkeypatch.undo()
    assert run.load_checkpoint()["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "model.pt"]  # no temporary file left


def test_metrics_append_and_read(tmp_path):
    run = RunDir(tmp_path)
    assert run.read_metrics() == []
    run.append_metrics({"step": 1, "loss": np.float32(2.5), "log_z": torch.tensor(1.5)})
    run.append_metrics({"step": 2, "loss": 2.0})
    assert run.read_metrics() == [{"step": 1, "loss": 2.5, "log_z": 1.5}, {"step": 2, "loss": 2.0}]
    assert len(run.file(layout.METRICS).read_text().splitlines()) == 2


def test_metrics_partial_last_line_is_ignored_then_dropped(tmp_path):
    """Appends are atomic rewrites now; a run written by an older version (no manifest) may
    still end in a partial line from a crash in the middle of an append."""
    run = RunDir(tmp_path)
    run.file(layout.METRICS).write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    assert run.read_metrics() == [{"step": 1, "loss": 2.0}]
    run.append_metrics({"step": 2, "loss": 1.0})
    assert run.read_metrics() == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]


def test_metrics_malformed_line_names_file_and_line(tmp_path):
    run = RunDir(tmp_path)
    run.file(layout.METRICS).write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        run.read_metrics()


def test_rewind_metrics_drops_records_after_the_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    for step in (10, 20, 30):
        run.append_metrics({"step": step, "loss": 1.0 / step})
    kept = run.rewind_metrics(20)
    assert [r["step"] for r in kept] == [10, 20]
    assert [r["step"] for r in run.read_metrics()] == [10, 20]


def test_config_and_test_metrics_round_trip(tmp_path):
    cfg = load_config(None, ["model.dim=32", "train.lr=0.01", "eval.topn=[10, 20]"])
    run = RunDir(tmp_path)
    run.save_config(cfg)
    assert json.loads(run.file(layout.CONFIG).read_text())["model"]["dim"] == 32
    assert run.read_config() == cfg
    resolved_cfg = resolved(cfg)
    run.save_config(resolved_cfg)  # what a run saves: every automatic value decided
    assert run.read_config() == resolved_cfg
    run.save_test_metrics({"recall@50": np.float64(0.125), "users": np.int64(7)})
    assert run.read_test_metrics() == {"recall@50": 0.125, "users": 7}


def test_new_run_dir_names(tmp_path):
    first = new_run_dir(tmp_path, model="comirec_sa", dataset="amazon beauty/x")
    second = new_run_dir(tmp_path, model="comirec_sa", dataset="amazon beauty/x")
    assert re.fullmatch(r"comirec_sa-amazon_beauty_x-\d{8}-\d{6}(-\d+)?", first.name)
    assert first != second and first.is_dir() and second.is_dir()
    named = new_run_dir(tmp_path, "mine")
    assert named == tmp_path / "mine" and named.is_dir()
    assert new_run_dir(tmp_path, "mine") == named  # empty: nothing to lose
    RunDir(named).save_checkpoint({"step": 1})
    with pytest.raises(FileExistsError, match="mine"):
        new_run_dir(tmp_path, "mine")
    assert new_run_dir(tmp_path, "mine", exist_ok=True) == named


def test_new_run_dir_replaces_a_run_killed_before_its_first_checkpoint(tmp_path):
    killed = RunDir.create(tmp_path / "run")
    killed.save_config(load_config(None))
    killed.append_metrics({"step": 100, "loss": 4.0})
    (killed.path / ".model.pt.abc.tmp").write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match="stopped before its first checkpoint"):
        assert new_run_dir(tmp_path, "run") == killed.path
    assert [p.name for p in killed.path.iterdir()] == [layout.LOCK]  # held by this process now
    (killed.path / "notes.txt").write_text("mine")  # not a run file: never replaced
    with pytest.raises(FileExistsError, match="run directory .* exists"):
        new_run_dir(tmp_path, "run")
