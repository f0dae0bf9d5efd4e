"""The run manifest (recsys.integrity): recorded on write, verified on load, crash-safe."""

import hashlib
import json
import os

import pytest

from recsys import integrity
from recsys.integrity import IntegrityError


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_record_then_verify_accepts_the_same_bytes(tmp_path):
    path = _write(tmp_path / "sub" / "a.bin", b"x" * 3000)
    digest = integrity.record(tmp_path, path)
    assert digest == integrity.Digest(3000, hashlib.sha256(b"x" * 3000).hexdigest())
    assert integrity.read_manifest(tmp_path) == {"sub/a.bin": {"size": 3000, "sha256": digest.sha256}}
    integrity.verify(tmp_path, path, "re-train")  # no error


@pytest.mark.parametrize("damage, word", [
    (lambda b: b[:1000], "truncated"),
    (lambda b: b[:500] + bytes(64) + b[564:], "corrupted"),  # 64 bytes flipped, same size
    (lambda b: b + b"more", "changed"),
])
def test_damage_is_one_line_naming_the_file_and_the_advice(tmp_path, damage, word):
    data = os.urandom(3000)
    path = _write(tmp_path / "best.pt", data)
    integrity.record(tmp_path, path)
    path.write_bytes(damage(data))
    with pytest.raises(IntegrityError) as err:
        integrity.verify(tmp_path, path, "resume from model.pt or re-train")
    message = str(err.value)
    assert "\n" not in message and str(path) in message and word in message
    assert message.endswith("resume from model.pt or re-train")


def test_missing_listed_file_and_unlisted_files(tmp_path):
    path = _write(tmp_path / "a.bin", b"abc")
    integrity.record(tmp_path, path)
    path.unlink()
    with pytest.raises(IntegrityError, match="a.bin: missing"):
        integrity.verify(tmp_path, path, "re-train")
    other = _write(tmp_path / "unlisted.bin", b"anything")
    integrity.verify(tmp_path, other, "re-train")  # not in the manifest: not checked
    integrity.verify(tmp_path / "no-run", tmp_path / "no-run" / "x", "re-train")  # no manifest at all


def test_replace_recorded_is_crash_safe(tmp_path, monkeypatch):
    """Killed between announcing the new digest and the rename, the old file still verifies;
    after the rename, the new one verifies while the manifest still lists both."""
    path = _write(tmp_path / "model.pt", b"old content")
    integrity.record(tmp_path, path)
    tmp = _write(tmp_path / ".model.pt.tmp", b"new content, longer")

    real_replace = os.replace

    def killed_at_the_rename(src, dst):
        if str(dst) == str(path):
            raise KeyboardInterrupt
        real_replace(src, dst)  # manifest updates go through

    monkeypatch.setattr(integrity.os, "replace", killed_at_the_rename)
    with pytest.raises(KeyboardInterrupt):
        integrity.replace_recorded(tmp, path, tmp_path)
    monkeypatch.undo()
    assert "pending" in integrity.read_manifest(tmp_path)["model.pt"]
    integrity.verify(tmp_path, path, "x")  # the old file
    os.replace(tmp, path)  # the rename happened, the final manifest update did not
    integrity.verify(tmp_path, path, "x")
    path.write_bytes(b"third content")
    with pytest.raises(IntegrityError):
        integrity.verify(tmp_path, path, "x")


def test_replace_recorded_keeps_only_the_new_digest(tmp_path):
    path = _write(tmp_path / "f", b"one")
    integrity.record(tmp_path, path)
    integrity.replace_recorded(_write(tmp_path / ".f.tmp", b"two"), path, tmp_path)
    entry = integrity.read_manifest(tmp_path)["f"]
    assert entry == {"size": 3, "sha256": hashlib.sha256(b"two").hexdigest()}
    assert not (tmp_path / ".f.tmp").exists()


def test_record_tree_and_verify_tree(tmp_path):
    for name in ("a.npz", "b.json"):
        _write(tmp_path / "dataset" / name, name.encode() * 10)
    integrity.record_tree(tmp_path, tmp_path / "dataset")
    assert sorted(integrity.read_manifest(tmp_path)) == ["dataset/a.npz", "dataset/b.json"]
    integrity.verify_tree(tmp_path, tmp_path / "dataset", "x")
    (tmp_path / "dataset" / "b.json").write_bytes(b"{}")
    with pytest.raises(IntegrityError, match="b.json"):
        integrity.verify_tree(tmp_path, tmp_path / "dataset", "x")


def test_damaged_manifest_is_an_integrity_error(tmp_path):
    (tmp_path / integrity.MANIFEST).write_text("{not json")
    with pytest.raises(IntegrityError, match="manifest"):
        integrity.read_manifest(tmp_path)
    (tmp_path / integrity.MANIFEST).write_text(json.dumps([1, 2]))
    with pytest.raises(IntegrityError, match="manifest"):
        integrity.read_manifest(tmp_path)


def test_files_get_the_default_mode(tmp_path):
    path = _write(tmp_path / "f", b"1")
    integrity.record(tmp_path, path)
    old = os.umask(0o027)
    try:
        assert integrity.default_file_mode() == 0o640
    finally:
        os.umask(old)
    assert (tmp_path / integrity.MANIFEST).stat().st_mode & 0o777 == integrity.default_file_mode()
