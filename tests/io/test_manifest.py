"""The run manifest (recsys.io.manifest): recorded on write, verified on load, crash-safe."""

import hashlib
import json
import os

import pytest

from recsys.io import IntegrityError, default_file_mode, manifest


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_record_then_verify_accepts_the_same_bytes(tmp_path):
    path = _write(tmp_path / "sub" / "a.bin", b"x" * 3000)
    digest = manifest.record(tmp_path, path)
    assert digest == manifest.Digest(3000, hashlib.sha256(b"x" * 3000).hexdigest())
    assert manifest.read_manifest(tmp_path) == {"sub/a.bin": {"size": 3000, "sha256": digest.sha256}}
    manifest.verify(tmp_path, path, "re-train")  # no error


@pytest.mark.parametrize(
    "damage, word",
    [
        (lambda b: b[:1000], "truncated"),
        (lambda b: b[:500] + bytes(64) + b[564:], "corrupted"),  # 64 bytes flipped, same size
        (lambda b: b + b"more", "changed"),
    ],
)
def test_damage_is_one_line_naming_the_file_and_the_advice(tmp_path, damage, word):
    data = os.urandom(3000)
    path = _write(tmp_path / "best.pt", data)
    manifest.record(tmp_path, path)
    path.write_bytes(damage(data))
    with pytest.raises(IntegrityError) as err:
        manifest.verify(tmp_path, path, "resume from model.pt or re-train")
    message = str(err.value)
    assert "\n" not in message and str(path) in message and word in message
    assert message.endswith("resume from model.pt or re-train")


def test_missing_listed_file_and_unlisted_files(tmp_path):
    path = _write(tmp_path / "a.bin", b"abc")
    manifest.record(tmp_path, path)
    path.unlink()
    with pytest.raises(IntegrityError, match="a.bin: missing"):
        manifest.verify(tmp_path, path, "re-train")
    other = _write(tmp_path / "unlisted.bin", b"anything")
    manifest.verify(tmp_path, other, "re-train")  # not in the manifest: not checked
    manifest.verify(tmp_path / "no-run", tmp_path / "no-run" / "x", "re-train")  # no manifest at all


def test_replace_recorded_is_crash_safe(tmp_path, monkeypatch):
    """Killed between announcing the new digest and the rename, the old file still verifies;
    after the rename, the new one verifies while the manifest still lists both."""
    path = _write(tmp_path / "model.pt", b"old content")
    manifest.record(tmp_path, path)
    tmp = _write(tmp_path / ".model.pt.tmp", b"new content, longer")

    real_replace = os.replace

    def killed_at_the_rename(src, dst):
        if str(dst) == str(path):
            raise KeyboardInterrupt
        real_replace(src, dst)  # manifest updates go through

    monkeypatch.setattr(manifest.os, "replace", killed_at_the_rename)
    with pytest.raises(KeyboardInterrupt):
        manifest.replace_recorded(tmp, path, tmp_path)
    monkeypatch.undo()
    assert "pending" in manifest.read_manifest(tmp_path)["model.pt"]
    manifest.verify(tmp_path, path, "x")  # the old file
    os.replace(tmp, path)  # the rename happened, the final manifest update did not
    manifest.verify(tmp_path, path, "x")
    path.write_bytes(b"third content")
    with pytest.raises(IntegrityError):
        manifest.verify(tmp_path, path, "x")


def test_replace_recorded_keeps_only_the_new_digest(tmp_path):
    path = _write(tmp_path / "f", b"one")
    manifest.record(tmp_path, path)
    manifest.replace_recorded(_write(tmp_path / ".f.tmp", b"two"), path, tmp_path)
    entry = manifest.read_manifest(tmp_path)["f"]
    assert entry == {"size": 3, "sha256": hashlib.sha256(b"two").hexdigest()}
    assert not (tmp_path / ".f.tmp").exists()


def test_record_tree_and_verify_tree(tmp_path):
    for name in ("a.npz", "b.json"):
        _write(tmp_path / "dataset" / name, name.encode() * 10)
    manifest.record_tree(tmp_path, tmp_path / "dataset")
    assert sorted(manifest.read_manifest(tmp_path)) == ["dataset/a.npz", "dataset/b.json"]
    manifest.verify_tree(tmp_path, tmp_path / "dataset", "x")
    (tmp_path / "dataset" / "b.json").write_bytes(b"{}")
    with pytest.raises(IntegrityError, match="b.json"):
        manifest.verify_tree(tmp_path, tmp_path / "dataset", "x")


def test_damaged_manifest_is_an_integrity_error(tmp_path):
    (tmp_path / manifest.MANIFEST).write_text("{not json")
    with pytest.raises(IntegrityError, match="manifest"):
        manifest.read_manifest(tmp_path)
    (tmp_path / manifest.MANIFEST).write_text(json.dumps([1, 2]))
    with pytest.raises(IntegrityError, match="manifest"):
        manifest.read_manifest(tmp_path)


def test_files_get_the_default_mode(tmp_path):
    path = _write(tmp_path / "f", b"1")
    manifest.record(tmp_path, path)
    old = os.umask(0o027)
    try:
        assert default_file_mode() == 0o640
    finally:
        os.umask(old)
    assert (tmp_path / manifest.MANIFEST).stat().st_mode & 0o777 == default_file_mode()
