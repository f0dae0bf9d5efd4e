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
