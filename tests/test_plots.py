"""`recsys plot`: loss and validation curves of runs into one PNG."""

import shutil

import pytest

from recsys.cli import main
from recsys.plots import curves, draw_curves
from recsys.run import RunDir

pytest.importorskip("matplotlib")


def test_plot_writes_a_png_of_several_runs(tiny_run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    out = tmp_path / "curves.png"
    assert main(["plot", tiny_run, str(other), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert f"curves written to {out}" in capsys.readouterr().out


def test_draw_curves_draws_only_the_curves_a_run_has(tmp_path):
    import matplotlib.image

    records = [{"step": 5, "loss": 3.0}, {"step": 10, "loss": 2.5}, {"step": 10, "split": "valid", "recall@50": 0.2}]
    one = matplotlib.image.imread(draw_curves({"a": records}, tmp_path / "one.png"))
    with_health = records + [{"step": 10, "split": "valid", "mi_eff_clicks": 2.0}]
    three = matplotlib.image.imread(draw_curves({"a": with_health}, tmp_path / "three.png"))
    assert three.shape[1] > one.shape[1] * 1.4  # a third panel
    with pytest.raises(ValueError, match="b: no training loss"):
        draw_curves({"a": records, "b": [{"step": 1, "samples_per_s": 3.0}]}, tmp_path / "x.png")


def test_the_validation_panel_draws_the_run_s_objective(tmp_path):
    import matplotlib.image

    records = [{"step": 5, "loss": 3.0}, {"step": 10, "split": "valid", "ndcg@10": 0.2}]  # no recall@50
    loss_only = matplotlib.image.imread(draw_curves({"a": records[:1]}, tmp_path / "loss.png"))
    drawn = matplotlib.image.imread(draw_curves({"a": records}, tmp_path / "ndcg.png", "ndcg@10"))
    assert drawn.shape[1] > loss_only.shape[1] * 1.4  # its own panel
    assert curves("ndcg@10")[1] == ("valid ndcg@10", "ndcg@10", "valid")


def test_plot_of_a_missing_run_names_it(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")]) == 2
    assert "nope: no such run directory" in capsys.readouterr().err
    RunDir.create(tmp_path / "empty")
    assert main(["plot", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")]) == 2
    assert "empty: no training loss" in capsys.readouterr().err


def test_a_failed_save_leaves_no_open_figure(tmp_path):
    import matplotlib.pyplot as plt

    plt.close("all")
    with pytest.raises(FileNotFoundError):
        draw_curves({"a": [{"step": 5, "loss": 3.0}]}, tmp_path / "missing" / "x.png")
    assert plt.get_fignums() == []


def test_draw_interests_of_no_users_names_the_argument(tiny_run, tmp_path):
    from recsys.api import Run

    with pytest.raises(ValueError, match="users: must be > 0, got 0"):
        Run.load(tiny_run, device="cpu").draw_interests(tmp_path / "x.png", users=0)


@pytest.mark.parametrize("command", ["plot", "inspect"])
def test_out_in_a_missing_folder_fails_before_any_work(command, tiny_run, tmp_path, monkeypatch, capsys):
    import recsys.api
    import recsys.run

    def no_work(*args, **kwargs):
        raise AssertionError("work started before --out was checked")

    monkeypatch.setattr(recsys.run.RunDir, "read_metrics", no_work)
    monkeypatch.setattr(recsys.api.Run, "load", no_work)
    assert main([command, tiny_run, "--out", str(tmp_path / "missing" / "x.png")]) == 2
    assert "--out: folder" in capsys.readouterr().err
