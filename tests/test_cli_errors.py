"""The CLI's one error path and the failures issue 16 found: each is one line and exit 2, never
a traceback (unless --debug), and checked before any work."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from recsys.cli import main

from conftest import TINY_RUN_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
TINY_DATA = [a for o in TINY_RUN_OVERRIDES if not o.startswith(("name=", "train.")) for a in ("--set", o)]


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A private copy of the tiny run, free to damage."""
    return shutil.copytree(tiny_run, tmp_path / "run")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def _flip(path: Path, offset: int, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_flipped_bytes_in_best_pt_are_caught_before_evaluating(run_copy, capsys):
    """Was: evaluated without complaint (Recall@50 0.4620 instead of 0.4808)."""
    _flip(run_copy / "best.pt", (run_copy / "best.pt").stat().st_size // 2)
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert "best.pt: corrupted" in line and "re-train" in line


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate"],
        ["index", "--factory", "Flat"],
        ["recommend", "--all", "--out", "{tmp}/r.csv"],
    ],
)
def test_truncated_best_pt_is_one_line_in_every_command(run_copy, tmp_path, capsys, command):
    """Was: a torch traceback without the file named."""
    _truncate(run_copy / "best.pt")
    argv = [command[0], str(run_copy)] + [a.format(tmp=tmp_path) for a in command[1:]]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert f"{run_copy / 'best.pt'}: truncated" in line


def test_truncated_best_pt_in_serve(run_copy, capsys):
    pytest.importorskip("fastapi")
    _truncate(run_copy / "best.pt")
    assert main(["serve", str(run_copy), "--port", "0"]) == 2
    assert "best.pt: truncated" in _error_line(capsys)


def test_unreadable_checkpoint_without_a_manifest_is_still_one_line(run_copy, capsys):
    """Runs written before manifests existed: torch's error becomes one line naming the file."""
    (run_copy / "manifest.json").unlink()
    _truncate(run_copy / "best.pt")
    assert main(["evaluate", str(run_copy)]) == 2
    assert "best.pt: cannot be read" in _error_line(capsys)


def test_truncated_model_pt_stops_resume_with_advice(run_copy, capsys):
    _truncate(run_copy / "model.pt")
    assert main(["train", "--resume", str(run_copy), "--set", "train.max_steps=40"]) == 2
    line = _error_line(capsys)
    assert "model.pt: truncated" in line and "best.pt" in line  # names the other checkpoint


def test_damaged_config_json_names_the_file(run_copy, capsys):
    (run_copy / "config.json").write_text((run_copy / "config.json").read_text()[:50])
    assert main(["evaluate", str(run_copy)]) == 2
    assert "config.json" in _error_line(capsys)
    (run_copy / "manifest.json").unlink()  # and without a manifest: the JSON error names it
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert "config.json: invalid JSON" in line


def test_debug_switch_and_environment_variable_show_the_traceback(run_copy, monkeypatch, capsys):
    _truncate(run_copy / "best.pt")
    with pytest.raises(ValueError, match="best.pt"):
        main(["evaluate", str(run_copy), "--debug"])
    monkeypatch.setenv("RECSYS_DEBUG", "1")
    with pytest.raises(ValueError, match="best.pt"):
        main(["evaluate", str(run_copy)])


def test_existing_run_name_is_one_line(tmp_path, capsys):
    """Was: a FileExistsError traceback."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("not a run")
    assert main(["train", "--set", f"output_dir={tmp_path}", "--set", "name=taken", *TINY_DATA]) == 2
    assert "taken exists" in _error_line(capsys)
    assert (tmp_path / "taken" / "notes.txt").is_file()


def _other_models_best(run: Path) -> None:
    """Write the weights of a model with half the run's dim (a smaller file) as the run's best.pt."""
    import dataclasses

    import torch

    from recsys.models import build_model
    from recsys.run import RunDir

    cfg = RunDir(run).read_config()
    num_items = RunDir(run).load_dataset().num_items
    other = build_model(dataclasses.replace(cfg.model, dim=cfg.model.dim // 2), num_items, cfg.data.max_len)
    torch.save({"model": other.state_dict()}, run / "best.pt")


def test_flipped_bytes_in_best_pt_without_a_manifest_are_caught(run_copy, capsys):
    """Was: with manifest.json deleted, a bit-flipped best.pt evaluated silently."""
    (run_copy / "manifest.json").unlink()
    _flip(run_copy / "best.pt", (run_copy / "best.pt").stat().st_size // 2)
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert "best.pt: corrupted (its entry" in line and "CRC-32" in line


@pytest.mark.parametrize("with_manifest", [False, True])
def test_another_models_weights_are_named_as_such(run_copy, capsys, with_manifest):
    """Was: `Error(s) in loading state_dict` (no manifest), or "best.pt: truncated" (with one)."""
    if not with_manifest:
        (run_copy / "manifest.json").unlink()
    _other_models_best(run_copy)
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert f"{run_copy / 'best.pt'}: weights of another model (" in line
    assert "is [" in line and "where the config's model has [" in line and "truncated" not in line


def test_a_flipped_bit_in_the_manifest_is_reported_as_the_manifest(run_copy, capsys):
    """Was: reported as "best.pt: corrupted" (the manifest's own bytes had changed)."""
    import json

    path = run_copy / "manifest.json"
    sha = json.loads(path.read_text())["best.pt"]["sha256"]
    path.write_text(path.read_text().replace(sha, chr(ord(sha[0]) ^ 1) + sha[1:]))
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert "manifest.json: damaged manifest" in line and "best.pt" not in line


def test_resume_restores_a_missing_best_pt(run_copy, capsys):
    """Was: the resume succeeded and `recsys evaluate` then said the run had no trained weights."""
    (run_copy / "best.pt").unlink()
    assert main(["train", "--resume", str(run_copy), "--set", "train.max_steps=30"]) == 0
    err = capsys.readouterr().err
    assert "best.pt: missing; restored from model.pt (the best weights, of step 20)" in err
    assert main(["evaluate", str(run_copy)]) == 0


def test_a_missing_best_pt_is_restored_as_the_weights_validation_scored(run_copy):
    """With train.ema_decay (the default) validation scores the weight average: that is what comes back."""
    import torch

    from recsys.run import RunDir

    run = RunDir(run_copy)
    assert run.read_config().train.ema_decay > 0 and "average" in run.load_checkpoint()
    saved = run.load_best()
    (run_copy / "best.pt").unlink()
    with pytest.warns(UserWarning, match=r"restored from model.pt \(the best weights"):
        run.require_checkpoint()
    restored = RunDir(run_copy).load_best()
    assert restored.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(restored[name], tensor), name


def test_a_truncated_metrics_log_does_not_block_the_resume(run_copy, capsys):
    """Was: "metrics.jsonl: truncated" refused a resume whose checkpoints were fine."""
    _truncate(run_copy / "metrics.jsonl")
    assert main(["train", "--resume", str(run_copy), "--set", "train.max_steps=30"]) == 0
    assert "metrics.jsonl: truncated" in capsys.readouterr().err  # a warning: the resume went on
    from recsys.run import RunDir

    assert max(r["step"] for r in RunDir(run_copy).read_metrics()) == 30


def test_a_run_killed_before_its_first_checkpoint_can_be_started_again(tmp_path, capsys):
    """Was: `--resume` refused the folder, and a new run of the same name refused it too."""
    from recsys.config import load_config
    from recsys.run import RunDir

    killed = RunDir.create(tmp_path / "tiny")  # what `kill -9` leaves before the first validation
    killed.save_config(load_config(None, TINY_RUN_OVERRIDES))
    killed.append_metrics({"step": 10, "loss": 4.0})
    assert main(["train", "--resume", str(killed.path)]) == 2
    assert "with the same name, it replaces this folder" in _error_line(capsys)
    assert (
        main(
            [
                "train",
                *TINY_DATA,
                "--set",
                "train.max_steps=10",
                "--set",
                "train.eval_every=10",
                "--set",
                f"output_dir={tmp_path}",
                "--set",
                "name=tiny",
            ]
        )
        == 0
    )
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    assert RunDir(killed.path).has_checkpoint()


def _no_work(monkeypatch):
    from recsys.api import Run

    def fail(*args, **kwargs):
        raise AssertionError("the run was loaded before the output was checked")

    monkeypatch.setattr(Run, "load", fail)


def test_recommend_checks_output_format_and_extra_before_any_work(tiny_run, tmp_path, monkeypatch, capsys):
    """Was: ImportError (parquet without pyarrow) or the .xlsx error after every user was computed."""
    _no_work(monkeypatch)
    assert main(["recommend", tiny_run, "--all", "--out", str(tmp_path / "r.xlsx")]) == 2
    assert "r.xlsx must end in .parquet" in _error_line(capsys)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert main(["recommend", tiny_run, "--all", "--out", str(tmp_path / "r.parquet")]) == 2
    assert "pip install 'multi-interest-recsys[parquet]'" in _error_line(capsys)
    assert main(["recommend", tiny_run, "--all", "--out", str(tmp_path / "no" / "r.csv")]) == 2
    assert "does not exist" in _error_line(capsys)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_floats_are_refused_before_the_data_loads(tmp_path, monkeypatch, capsys, value):
    """Was: train.lr=inf trained 500 steps on NaN loss; nan failed only after loading the data."""
    import recsys.data

    monkeypatch.setattr(recsys.data, "load_dataset", lambda cfg: pytest.fail("data loaded"))
    assert main(["train", "--set", f"train.lr={value}", "--set", f"output_dir={tmp_path}"]) == 2
    assert f"train.lr: must be a finite number, got {value.lstrip('-') if value == 'nan' else value}" in _error_line(
        capsys
    ).replace("'", "")
    assert not any(tmp_path.iterdir())


def test_memory_estimate_refuses_what_cannot_fit(tmp_path, monkeypatch, capsys):
    """Was: model.num_interests=100000 was killed by the out-of-memory killer with no message (it is
    refused by its bound now; a huge batch of the most interests allowed stands in for it)."""
    from recsys.train import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 24 * 1024**3)
    big = ["--set", "model.num_interests=64", "--set", "train.batch_size=65536"]
    assert main(["train", *TINY_DATA, *big, "--set", f"output_dir={tmp_path}"]) == 2
    line = _error_line(capsys)
    assert "train.batch_size=65536" in line and "GiB" in line and "24.0 GiB free" in line
    assert not any(tmp_path.iterdir())  # refused before the run folder exists


def test_memory_estimate_comes_before_the_model_is_allocated(tmp_path, monkeypatch, capsys):
    """Was: model.dim=100000 allocated its 160 GB model (a traceback from the allocator, or the
    out-of-memory killer) before the estimate could refuse it."""
    import torch

    from recsys.run import experiment
    from recsys.train import memory

    real_build = experiment.build_model

    def build_without_allocating_big_models(model_cfg, *args, **kwargs):
        assert model_cfg.dim < 1000 or torch.get_default_device().type == "meta", "allocated before the estimate"
        return real_build(model_cfg, *args, **kwargs)

    monkeypatch.setattr(experiment, "build_model", build_without_allocating_big_models)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 24 * 1024**3)
    assert main(["train", *TINY_DATA, "--set", "model.dim=100000", "--set", f"output_dir={tmp_path}"]) == 2
    line = _error_line(capsys)
    assert "model.dim=100000" in line and "more than the 24.0 GiB free" in line
    assert not any(tmp_path.iterdir())


def test_too_small_dataset_leaves_no_run_folder(tmp_path, capsys):
    """Was: a partial run folder left behind."""
    assert (
        main(
            [
                "train",
                "--set",
                "synthetic.num_users=3",
                "--set",
                "synthetic.num_items=50",
                "--set",
                "model.backend=torch",
                "--set",
                f"output_dir={tmp_path}",
            ]
        )
        == 2
    )
    assert "too small to split" in _error_line(capsys)
    assert not any(tmp_path.iterdir())


def test_failure_before_the_first_checkpoint_removes_the_folder(tmp_path, monkeypatch, capsys):
    from recsys.train import trainer

    def broken(*args, **kwargs):
        raise ValueError("validation exploded")

    monkeypatch.setattr(trainer, "evaluate_with_config", broken)
    assert (
        main(
            [
                "train",
                "--set",
                f"output_dir={tmp_path}",
                *TINY_DATA,
                "--set",
                "train.max_steps=4",
                "--set",
                "train.eval_every=2",
            ]
        )
        == 2
    )
    assert "validation exploded" in _error_line(capsys)
    assert not any(tmp_path.iterdir())


def test_resume_of_a_run_without_checkpoint_says_so(tmp_path, capsys):
    run = tmp_path / "interrupted"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert main(["train", "--resume", str(run)]) == 2
    assert "has no checkpoint" in _error_line(capsys)


def test_the_config_is_printed_only_with_verbose(capsys):
    assert main(["data", *TINY_DATA]) == 0
    assert "# given config" not in capsys.readouterr().out
    assert main(["data", *TINY_DATA, "--verbose"]) == 0
    assert "# given config" in capsys.readouterr().out  # as written: train --dry-run prints it resolved


def test_skip_bad_rows_warning_is_one_line_without_python_source(tmp_path):
    rows = "".join(f"u{u},i{i},{t}\n" for u in range(8) for t, i in enumerate(range(6)))
    path = tmp_path / "clicks.csv"
    path.write_text("user,item,timestamp\n" + rows + "u1,,3\n")
    out = subprocess.run(
        [sys.executable, "-m", "recsys", "data", "--data", str(path), "--set", "data.skip_bad_rows=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if line.strip()]
    assert warning == [f"recsys: warning: {path}: skipped 1 malformed line (line 50)"]


def test_run_files_share_one_mode(tiny_run):
    """Was: checkpoints 0600, metrics 0644. Every run file now gets 0666 minus the umask."""
    run = Path(tiny_run)
    modes = {p.relative_to(run).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in run.rglob("*") if p.is_file()}
    for name in (
        "model.pt",
        "best.pt",
        "metrics.jsonl",
        "config.json",
        "test_metrics.json",
        "manifest.json",
        "dataset/items.npy",
    ):
        assert name in modes
    mask = os.umask(0)
    os.umask(mask)
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_a_run_without_a_manifest_loads_with_one_line_saying_what_is_not_verified(run_copy, capsys):
    """Was: with manifest.json deleted, the run loaded unverified and nothing said so."""
    assert main(["evaluate", str(run_copy)]) == 0
    assert "warning" not in capsys.readouterr().err
    (run_copy / "manifest.json").unlink()
    assert main(["evaluate", str(run_copy)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == [
        f"recsys: warning: {run_copy} has no manifest.json: its config, weights, dataset and indexes are read "
        "without SHA-256 verification (a changed or damaged file is not detected)"
    ]


@pytest.mark.parametrize("edit", ["shorter", "same size"])
def test_an_edited_config_is_reported_as_edited_not_truncated(run_copy, capsys, edit):
    """Was: "config.json: truncated (... bytes, the manifest says ...)" after a hand edit."""
    path = run_copy / "config.json"
    text = path.read_text()
    key = '"max_steps": 20'
    path.write_text(text.replace(key, '"max_steps": 9' if edit == "shorter" else '"max_steps": 30'))
    assert main(["evaluate", str(run_copy)]) == 2
    line = _error_line(capsys)
    assert f"{path}: edited after the run wrote it (" in line and "truncated" not in line
    assert "undo the edit" in line


def test_a_resumed_run_may_change_its_cpu_threads(run_copy):
    """The thread count is how the step runs, not what it trains: a run resumed on another machine
    (or a busier one) may set it, and config.json records it."""
    from recsys.run import RunDir

    sets = ["--set", "train.max_steps=30", "--set", "train.cpu_threads=1"]
    assert main(["train", "--resume", str(run_copy), *sets]) == 0
    assert RunDir(run_copy).read_config().train.cpu_threads == 1


def test_a_new_item_share_needs_a_run_with_item_features(tiny_run, tmp_path, capsys):
    assert main(["recommend", tiny_run, "--all", "--new-item-share", "0.1", "--out", str(tmp_path / "r.csv")]) == 2
    assert "retrieval.new_item_share=0.1: reserves places for items without clicks" in capsys.readouterr().err
    assert main(["serve", tiny_run, "--new-item-share", "1.5"]) == 2
    assert "retrieval.new_item_share: must be in [0, 1)" in capsys.readouterr().err
