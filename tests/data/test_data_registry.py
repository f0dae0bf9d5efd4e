"""The dataset registry (the top-level data/, shipped in the wheel): every entry loads, combines with
every model config, and is listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from recsys.cli import main
from recsys.config import DataConfig, load_config
from recsys.data.readers import DataError
from recsys.data.registry import REGISTRY_DIR, data_root, human_size, registry, resolve_source

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(ROOT.joinpath("experiments", "configs", "models").glob("*.toml"))
ENTRIES = registry()


def test_the_issue_s_datasets_are_registered():
    assert {
        "ml-100k",
        "ml-1m",
        "ml-20m",
        "amazon-books-comirec",
        "amazon-beauty",
        "amazon-sports",
        "taobao-comirec",
        "yelp",
        "steam",
        "gowalla",
        "retailrocket",
    } <= set(ENTRIES)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_is_complete_and_loads_with_every_model(name):
    e = ENTRIES[name]
    assert e.licence and e.homepage.startswith("https://") and e.files
    for f in e.files:
        assert f.url.startswith("https://") or f.manual  # downloadable, or says where to get it by hand
        assert all(len(h) == n and int(h, 16) >= 0 for h, n in ((f.sha256, 64), (f.md5, 32)) if h)
    assert len(MODELS) >= 8
    for model in MODELS:
        cfg = load_config([REGISTRY_DIR / f"{name}.toml", model])
        assert cfg.data.source.startswith(f"dataset:{name}/")
        assert cfg.model.name == model.stem


def test_data_list_prints_every_dataset_with_size_and_licence(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name, e in ENTRIES.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert human_size(e.size) in line and e.licence in line
    assert "RECSYS_DATA_DIR" in out
    assert "4.9 MB" in out and "unknown" in out


def test_data_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RECSYS_DATA_DIR", str(tmp_path))
    assert data_root() == tmp_path
    monkeypatch.delenv("RECSYS_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert data_root() == ROOT / "data" == REGISTRY_DIR  # a checkout: its data/, beside the registry
    monkeypatch.setattr("recsys.data.registry.CHECKOUT_DATA", None)  # an install
    assert data_root() == tmp_path / "cache" / "recsys" / "data"


def test_the_registry_is_the_checkouts_top_level_data_folder_and_git_ignores_fetched_data(tmp_path):
    """The design card's data/: the entries and their README at the top of the checkout, and a
    dataset fetched there is not something git would add."""
    import subprocess

    assert REGISTRY_DIR == ROOT / "data" and (ROOT / "data" / "README.md").is_file() and len(ENTRIES) >= 10
    assert not (ROOT / "recsys" / "data" / "registry").exists()
    paths = ["data/ml-100k/clicks.csv", "data/ml-100k.toml", "data/README.md"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True).stdout
    assert ignored.split() == ["data/ml-100k/clicks.csv"]


def test_resolve_source_leaves_plain_paths_alone_and_names_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.setenv("RECSYS_DATA_DIR", str(tmp_path))
    plain = DataConfig(source="clicks.csv")
    assert resolve_source(plain) is plain
    with pytest.raises(DataError, match=r"data.source: dataset 'steam' is not fetched .*recsys data fetch steam"):
        resolve_source(DataConfig(source="dataset:steam/clicks.csv"))
    (tmp_path / "steam").mkdir()
    (tmp_path / "steam" / "prepared.json").write_text("{}")
    resolved = resolve_source(DataConfig(source="dataset:steam/clicks.csv"))
    assert resolved.source == str(tmp_path / "steam" / "clicks.csv")


def test_unknown_dataset_lists_the_registered_ones(capsys):
    assert main(["data", "fetch", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'nope'" in err and "ml-100k" in err


def test_data_describe_still_works(tmp_path, capsys):
    """`recsys data --data PATH` (no subcommand) still reads and describes a click file."""
    rows = [f"u{u},i{(u * 7 + k) % 9},{k}" for u in range(12) for k in range(6)]
    (tmp_path / "clicks.csv").write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    assert main(["data", "--data", str(tmp_path / "clicks.csv")]) == 0
    out = capsys.readouterr().out
    assert "users         12" in out and "interactions  72" in out
