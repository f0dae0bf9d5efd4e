"""`recsys inspect` and `Run.health` / `Run.draw_interests` on a trained run."""

import pytest

from recsys.api import Run
from recsys.cli import main


def test_health_of_a_trained_run_has_every_metric(tiny_run):
    health = Run.load(tiny_run, device="cpu").health("valid")
    for i in range(4):
        assert 1.0 <= health[f"mi_eff_clicks_k{i}"] <= 10.0  # at most max_len clicks
        assert 0.0 <= health[f"mi_readout_share_k{i}"] <= 1.0
    assert sum(health[f"mi_readout_share_k{i}"] for i in range(4)) == pytest.approx(1.0)
    assert -1.0 <= health["mi_cosine"] <= 1.0
    for key in ("mi_planted_recovery", "mi_planted_in_input", "mi_planted_recovery_of_present"):
        assert 0.0 <= health[key] <= 1.0, key
    with pytest.raises(ValueError, match="split"):
        Run.load(tiny_run, device="cpu").health("train")


def test_cli_inspect_prints_the_table_and_writes_a_png(tiny_run, tmp_path, capsys):
    out = tmp_path / "interests.png"
    assert main(["inspect", tiny_run, "--out", str(out), "--users", "2"]) == 0
    text = capsys.readouterr().out
    assert "| interest | effective clicks | readout share |" in text
    assert text.count("\n| ") >= 5  # header + 4 interests
    assert "planted interests recovered" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_cli_inspect_without_matplotlib_prints_the_table_and_exits_0(tiny_run, tmp_path, monkeypatch, capsys):
    """Was: the table, then "drawing needs matplotlib" and exit status 2."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", tiny_run, "--users", "2"]) == 0
    captured = capsys.readouterr()
    assert "| interest | effective clicks | readout share |" in captured.out and not captured.err
    assert "no picture: drawing needs matplotlib: pip install 'multi-interest-recsys[plot]'" in captured.out
    assert not list(tmp_path.iterdir())
    # Asked for a picture by --out: refused before any work, with the same hint.
    assert main(["inspect", tiny_run, "--out", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert "interest |" not in captured.out and "multi-interest-recsys[plot]" in captured.err
