"""`recsys data fetch` without internet: a local HTTP server serves tiny files in each source's
real format; download, resume, checksums, conversion and counts are checked."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from recsys.cli import main
from recsys.config import load_config
from recsys.data import DataError, load_dataset
from recsys.data.fetch import FetchError, fetch
from recsys.data.registry import REGISTRY_DIR, entry

from dataset_fixtures import BUILDERS, FileServer  # tests/data is on sys.path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


def local_registry(
    tmp_path: Path, server: FileServer, name: str, files: list[bytes], *, check: str = "sha256", size_offset: int = 0
) -> Path:
    """A registry folder holding <name>.toml with its files served by ``server``:
    ``check`` is "sha256" (the right digest), "wrong" (a wrong digest) or "size" (no digest)."""
    real = tomllib.loads((REGISTRY_DIR / f"{name}.toml").read_text())["dataset"]
    lines = ["[dataset]"] + [f"{key} = {json.dumps(real[key])}" for key in ("title", "homepage", "licence", "convert")]
    for spec, data in zip(real["files"], files):
        server.files[f"/{name}/{spec['name']}"] = data
        digest = hashlib.sha256(data).hexdigest() if check == "sha256" else "0" * 64 if check == "wrong" else ""
        lines += [
            "[[dataset.files]]",
            f"name = {json.dumps(spec['name'])}",
            f'url = "{server.url}/{name}/{spec["name"]}"',
            f'sha256 = "{digest}"',
            f"size = {len(data) + size_offset}",
        ]
    folder = tmp_path / "registry"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text("\n".join(lines) + "\n")
    return folder


def quiet(lines: list[str]):
    return lines.append


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_download_and_convert_every_registered_format(name, server, tmp_path):
    """Each registry entry's converter reads its source's real format and reports the counts;
    the prepared files read back with the entry's own [data] settings."""
    files, counts = BUILDERS[name]()
    registry = local_registry(tmp_path, server, name, files)
    log: list[str] = []
    folder = fetch(name, dest=tmp_path / "root", registry_dir=registry, progress=False, log=quiet(log))
    prepared = json.loads((folder / "prepared.json").read_text())
    assert prepared["counts"] == counts
    assert prepared["sha256"] == {
        spec.name: hashlib.sha256(data).hexdigest() for spec, data in zip(entry(name, registry).files, files)
    }
    for spec, data in zip(entry(name, registry).files, files):
        assert (folder / "raw" / spec.name).read_bytes() == data

    cfg = load_config([REGISTRY_DIR / f"{name}.toml"], ["data.min_item_count=1", "data.min_user_count=1"])
    source = cfg.data.source.removeprefix(f"dataset:{name}/")
    cfg.data.source = str(folder / source)
    ds = load_dataset(cfg)
    assert (ds.num_users, ds.num_items - 1, len(ds.items)) == (counts["users"], counts["items"], counts["clicks"])
    if "categories" in counts:
        assert len(ds.category_raw) - 1 == counts["categories"]


def test_clicks_csv_keeps_times_and_categories(server, tmp_path):
    files, _ = BUILDERS["ml-1m"]()
    folder = fetch(
        "ml-1m",
        dest=tmp_path,
        registry_dir=local_registry(tmp_path, server, "ml-1m", files),
        progress=False,
        log=quiet([]),
    )
    clicks = pd.read_csv(folder / "clicks.csv")
    assert list(clicks.columns) == ["user", "item", "timestamp", "category"]
    assert clicks.iloc[0].tolist() == [1, 2, 1_000_864_000, "Comedy"]
    assert set(clicks["category"]) == {"Comedy", "Horror"}


def test_dataset_source_resolves_from_the_data_root(server, tmp_path, monkeypatch):
    """`--config <registry>/<name>.toml` finds the files fetched into $RECSYS_DATA_DIR and says how
    to fetch them when they are missing."""
    monkeypatch.setenv("RECSYS_DATA_DIR", str(tmp_path / "root"))
    paths = [REGISTRY_DIR / "ml-100k.toml", Path("experiments/configs/models/popular.toml")]
    cfg = load_config(paths, ["data.min_item_count=1", "data.min_user_count=1"])
    with pytest.raises(DataError, match="recsys data fetch ml-100k"):
        load_dataset(cfg)
    files, counts = BUILDERS["ml-100k"]()
    fetch("ml-100k", registry_dir=local_registry(tmp_path, server, "ml-100k", files), progress=False, log=quiet([]))
    assert load_dataset(cfg).num_users == counts["users"]


def test_resume_after_a_cut_connection(server, tmp_path):
    files, counts = BUILDERS["gowalla"]()
    path = "/gowalla/loc-gowalla_totalCheckins.txt.gz"
    files[0] += b"\x00" * 400_000  # gzip ignores trailing zeros; the download spans several chunks
    registry = local_registry(tmp_path, server, "gowalla", files)
    server.cut.add(path)
    with pytest.raises(FetchError, match="cannot download .*loc-gowalla.*kept and resumed.*--from FILE"):
        fetch("gowalla", dest=tmp_path, registry_dir=registry, progress=False, log=quiet([]))
    part = tmp_path / "gowalla" / "raw" / "loc-gowalla_totalCheckins.txt.gz.part"
    done = part.read_bytes()
    assert 0 < len(done) <= len(files[0]) // 2 and files[0].startswith(done)

    folder = fetch("gowalla", dest=tmp_path, registry_dir=registry, progress=False, log=quiet([]))
    assert server.requests[-1] == (path, f"bytes={len(done)}-")
    assert (folder / "raw" / "loc-gowalla_totalCheckins.txt.gz").read_bytes() == files[0]
    assert not part.exists()
    assert json.loads((folder / "prepared.json").read_text())["counts"] == counts


def test_checksum_mismatch_deletes_the_download(server, tmp_path):
    files, _ = BUILDERS["gowalla"]()
    registry = local_registry(tmp_path, server, "gowalla", files, check="wrong")
    with pytest.raises(FetchError, match="checksum mismatch for http.*deleted"):
        fetch("gowalla", dest=tmp_path, registry_dir=registry, progress=False, log=quiet([]))
    assert list((tmp_path / "gowalla" / "raw").iterdir()) == []


def test_unknown_checksum_prints_the_sha256_and_checks_the_size(server, tmp_path):
    files, _ = BUILDERS["gowalla"]()
    log: list[str] = []
    fetch(
        "gowalla",
        dest=tmp_path,
        registry_dir=local_registry(tmp_path, server, "gowalla", files, check="size"),
        progress=False,
        log=log.append,
    )
    assert any(hashlib.sha256(files[0]).hexdigest() in line and "record it" in line for line in log)

    bad = local_registry(tmp_path / "bad", server, "gowalla", files, check="size", size_offset=1)
    with pytest.raises(FetchError, match=f"{len(files[0]):,} bytes, expected {len(files[0]) + 1:,}.*deleted"):
        fetch("gowalla", dest=tmp_path / "bad", registry_dir=bad, progress=False, log=quiet([]))
    assert list((tmp_path / "bad" / "gowalla" / "raw").iterdir()) == []


def test_offline_error_names_the_url_and_the_from_alternative(tmp_path, capsys, monkeypatch):
    """A host that cannot be reached: one line naming the URL and `--from`, no traceback."""
    monkeypatch.setenv("RECSYS_DATA_DIR", str(tmp_path))
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = tmp_path / "registry"
    registry.mkdir()
    text = (
        (REGISTRY_DIR / "ml-100k.toml")
        .read_text()
        .replace("https://files.grouplens.org/datasets/movielens/ml-100k.zip", f"http://127.0.0.1:{port}/ml-100k.zip")
    )
    (registry / "ml-100k.toml").write_text(text)
    with pytest.raises(
        FetchError,
        match=rf"cannot download http://127.0.0.1:{port}/ml-100k.zip.*offline\?.*"
        r"recsys data fetch ml-100k --from FILE",
    ):
        fetch("ml-100k", registry_dir=registry, progress=False, log=quiet([]))

    monkeypatch.setattr("recsys.data.registry.REGISTRY_DIR", registry)
    monkeypatch.setattr("recsys.data.fetch.REGISTRY_DIR", registry)
    assert main(["data", "fetch", "ml-100k", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("recsys data: error: cannot download http://127.0.0.1") and "--from FILE" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_manual_dataset_says_where_to_download_and_where_to_put_it(tmp_path):
    with pytest.raises(
        FetchError,
        match=r"needs UserBehavior.csv.zip downloaded by hand.*tianchi.aliyun.com/dataset/"
        rf"649.*put it at {tmp_path}/taobao-comirec/raw/UserBehavior.csv.zip"
        r".*--from FILE",
    ):
        fetch("taobao-comirec", dest=tmp_path, progress=False, log=quiet([]))


def test_from_file_converts_and_a_bad_one_is_kept(tmp_path):
    files, counts = BUILDERS["taobao-comirec"]()
    given = tmp_path / "UserBehavior.csv.zip"
    given.write_bytes(files[0])
    log: list[str] = []
    folder = fetch("taobao-comirec", dest=tmp_path, sources=[given], progress=False, log=log.append)
    assert json.loads((folder / "prepared.json").read_text())["counts"] == counts
    assert sorted(p.name for p in (folder / "comirec").iterdir()) == [
        "taobao_item_cate.txt",
        "taobao_test.txt",
        "taobao_train.txt",
        "taobao_valid.txt",
    ]
    assert any(line.startswith("taobao-comirec: 10 users (published: 976,779)") for line in log)

    with pytest.raises(FetchError, match="--from .*: has md5 .*expected"):
        fetch("ml-100k", dest=tmp_path, sources=[given], progress=False, log=quiet([]))
    assert given.read_bytes() == files[0]  # the user's own file is never deleted


def test_already_prepared_is_left_alone(server, tmp_path):
    files, _ = BUILDERS["gowalla"]()
    registry = local_registry(tmp_path, server, "gowalla", files)
    fetch("gowalla", dest=tmp_path, registry_dir=registry, progress=False, log=quiet([]))
    served = len(server.requests)
    log: list[str] = []
    fetch("gowalla", dest=tmp_path, registry_dir=registry, progress=False, log=log.append)
    assert len(server.requests) == served and "already prepared" in log[0]


def test_without_the_data_extra_fetch_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pooch", None)  # import pooch raises ImportError
    files, _ = BUILDERS["gowalla"]()
    given = tmp_path / "checkins.txt.gz"
    given.write_bytes(files[0])
    with pytest.raises(FetchError, match=r"needs the data extra: pip install 'multi-interest-recsys\[data\]'"):
        fetch("gowalla", dest=tmp_path, sources=[given], progress=False, log=quiet([]))


def test_download_without_the_data_extra_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pooch", None)  # neither pooch nor its requests installed
    monkeypatch.setitem(sys.modules, "requests", None)
    with pytest.raises(FetchError, match=r"needs the data extra: pip install 'multi-interest-recsys\[data\]'"):
        fetch("gowalla", dest=tmp_path, progress=False, log=quiet([]))


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ml-100k"


@pytest.mark.data
@pytest.mark.skipif(not (SHARED / "u.data").is_file(), reason=f"real MovieLens 100K not found at {SHARED}")
def test_real_movielens_100k_converts_to_the_published_counts(tmp_path):
    """The real ml-100k files, zipped in GroupLens's layout (so not its md5: the registry copy
    has no checksum), convert to GroupLens's published counts."""
    import zipfile

    archive = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ("u.data", "u.item", "u.genre"):
            z.write(SHARED / name, f"ml-100k/{name}")
    registry = tmp_path / "registry"
    registry.mkdir()
    text = (REGISTRY_DIR / "ml-100k.toml").read_text().replace('md5 = "0e33842e24a9c977be4e0107933c0723"', 'md5 = ""')
    (registry / "ml-100k.toml").write_text(text.replace("size = 4924029", "size = 0"))
    log: list[str] = []
    folder = fetch("ml-100k", dest=tmp_path, sources=[archive], registry_dir=registry, progress=False, log=log.append)
    counts = json.loads((folder / "prepared.json").read_text())["counts"]
    assert counts == {"users": 943, "items": 1682, "clicks": 100_000, "categories": 18}
    assert any(line.startswith("ml-100k: 943 users (as published), 1,682 items (as published)") for line in log)


def test_failed_clicks_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from recsys.data.convert import write_clicks

    def broken(self, path, **kwargs):
        Path(path).write_text("user,item\n1,")  # half written, then the disk fills up
        raise OSError("No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    with pytest.raises(OSError, match="out/clicks.csv: no space left on device"):  # names the file
        write_clicks(pd.DataFrame({"user": ["u"], "item": ["i"], "timestamp": [1]}), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
