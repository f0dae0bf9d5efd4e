"""``recsys train --dry-run``: the resolved config and the plan of a run, without the run."""

import pytest

from recsys.cli import main
from recsys.config import AUTO, CONFIG_VERSION, automatic_keys, load_config
from recsys.models import model_names, spec_for
from recsys.run import RunDir
from recsys.train.trainer import dry_run, train
from tests.conftest import TINY_TRAIN_OVERRIDES

# "auto" that stays: the device decides these when the run starts (and may fall back from them) ...
DEVICE_KEYS = {"model.backend", "train.cuda_graph", "train.device", "retrieval.backend"}
# ... and the reader sniffs how to read the source file (the run saves the prepared clicks, not the file)
READER_KEYS = {"data.format", "data.prepare"}


def _sentinels(tree: dict, prefix: str = "") -> set[str]:
    """The dotted keys of ``tree`` (a config's ``to_dict()``) still holding -1 or "auto"."""
    found = set()
    for key, value in tree.items():
        if isinstance(value, dict):
            found |= _sentinels(value, f"{prefix}{key}.")
        elif value == AUTO or (not isinstance(value, bool) and value == -1):
            found.add(prefix + key)
    return found


@pytest.mark.parametrize("name", model_names())
def test_dry_run_prints_every_value_the_data_decides(tmp_path, capsys, name):
    """Every registered model: the config comes back with no automatic value left but the
    device's, the plan lines follow it, and nothing is written under output_dir."""
    overrides = [*TINY_TRAIN_OVERRIDES, "model.dim=-1", f"output_dir={tmp_path / 'runs'}", f"model.name={name}"]
    args = ["train", "--dry-run", "--quiet"] + [a for o in overrides for a in ("--set", o)]
    assert main(args) == 0
    out = capsys.readouterr().out
    config, _, plan = out.partition("\ndata: ")
    (tmp_path / "resolved.toml").write_text(config)  # what it prints, --config takes back
    printed = load_config([str(tmp_path / "resolved.toml")])
    assert automatic_keys(printed) == [] and printed.config_version == CONFIG_VERSION
    resolved = printed.to_dict()
    assert resolved["model"]["name"] == name
    assert _sentinels(resolved) <= DEVICE_KEYS | READER_KEYS
    assert resolved["model"]["dim"] > 0 and resolved["train"]["weight_decay"] >= 0
    assert f"model: {name}, " in plan
    spec = spec_for(name)
    assert (f"plan: batch 32, lr {spec.automatic.lr:g}; up to 40 steps" in plan) == spec.trainable
    assert not (tmp_path / "runs").exists()


def test_dry_run_config_is_the_one_the_run_saves(tmp_path):
    """What the dry run prints is what training then uses and saves, value for value."""
    cfg = load_config(None, [*TINY_TRAIN_OVERRIDES, f"output_dir={tmp_path}", "model.dim=-1"])
    lines: list[str] = []
    shown = dry_run(cfg, log=lines.append)
    logged: list[str] = []
    run = train(cfg, log=logged.append)
    assert RunDir(run.run_dir).read_config().to_dict() == shown.to_dict()
    plan = next(line for line in lines if line.startswith("plan: "))
    assert plan in logged and next(line for line in lines if line.startswith("model: ")) in logged


def test_dry_run_prints_the_batch_it_decides_and_the_rate(tmp_path, capsys):
    """Left automatic on the small synthetic log: batch 128; the rate is 1e-3 at a batch set by
    hand too."""
    base = [*TINY_TRAIN_OVERRIDES, f"output_dir={tmp_path}", "train.batch_size=0"]
    lines: list[str] = []
    shown = dry_run(load_config(None, base), log=lines.append)
    assert (shown.train.batch_size, shown.train.lr) == (128, 1e-3)
    assert next(line for line in lines if line.startswith("plan: ")).startswith("plan: batch 128, lr 0.001; ")
    args = ["train", "--dry-run", "--quiet"] + [a for o in [*base, "train.batch_size=512"] for a in ("--set", o)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "\nbatch_size = 512\n" in out and "\nlr = 0.001\n" in out
    assert "plan: batch 512, lr 0.001; up to 40 steps" in out


def test_dry_run_refuses_resume(tmp_path, capsys):
    assert main(["train", "--dry-run", "--resume", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


@pytest.mark.parametrize("factory, dim", [("Bogus", "16"), ("PQ7", "-1")])
def test_dry_run_refuses_a_factory_faiss_cannot_build(tmp_path, capsys, factory, dim):
    """Was: --dry-run accepted retrieval.factory=Bogus, and FAISS's C++ message came at the run's
    first validation. Refused in one line naming the key: with the width given before the data is
    read, with the automatic width (64, which 7 product quantizers do not divide) once it is decided."""
    overrides = [*TINY_TRAIN_OVERRIDES, f"model.dim={dim}", f"retrieval.factory={factory}", f"output_dir={tmp_path}"]
    assert main(["train", "--dry-run", "--quiet"] + [a for o in overrides for a in ("--set", o)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"recsys train: error: retrieval.factory: FAISS cannot build {factory!r} over ")
    assert len(err.splitlines()) == 1 and "Error in" not in err and not any(tmp_path.iterdir())


def test_a_run_checks_its_config_as_written_and_as_resolved_and_plans_its_step_once(tmp_path, monkeypatch):
    """Every decision once: ``recsys train`` checks the written config (before the data is read)
    and the resolved one, once each, and plans the CUDA graph once; K = 1's saved config holds no
    readout settings it would ignore."""
    from recsys.run import experiment, settings
    from recsys.train import step, trainer

    checked, planned = [], []
    real_check, real_plan = settings.check, trainer.plan_graph

    def counted_check(cfg):
        checked.append(automatic_keys(cfg) == [])
        return real_check(cfg)

    def counted_plan(*args, **kwargs):
        planned.append(args)
        return real_plan(*args, **kwargs)

    for module in (settings, experiment):
        monkeypatch.setattr(module, "check", counted_check)
    monkeypatch.setattr(trainer, "plan_graph", counted_plan)
    monkeypatch.setattr(step, "plan_graph", counted_plan)
    overrides = [*TINY_TRAIN_OVERRIDES, "model.name=youtube_dnn", "train.max_steps=4", f"output_dir={tmp_path}"]
    args = ["train", "--quiet"] + [a for o in overrides for a in ("--set", o)]
    assert main(args) == 0
    assert checked == [False, True] and len(planned) == 1  # written, then resolved
    (run,) = tmp_path.iterdir()
    saved = RunDir(run).read_config()
    assert (saved.train.soft_readout_steps, saved.train.negative_readout) == (0, "readout")
