"""Tests for lightning_pfd.cache: keys, atomic writes, verified loads."""
import os

import pytest
import torch

from lightning_pfd import cache
from lightning_pfd.cache import cache_dir, hash_key, load_tensor_verified, save_tensor_atomic


def test_cache_dir_env_and_created(tmp_path, monkeypatch):
    target = tmp_path / "a" / "b"
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(target))
    assert cache_dir() == target
    assert target.is_dir()


def test_cache_dir_default(tmp_path, monkeypatch):
    monkeypatch.delenv("LIGHTNING_PFD_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "lightning_pfd"
    assert cache_dir().is_dir()


def test_hash_key_content_not_identity():
    a = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert hash_key("x", a, 3) == hash_key("x", a.clone(), 3)
    # content, dtype and shape all matter
    b = a.clone()
    b[1, 2] += 1e-12
    assert hash_key(a) != hash_key(b)
    assert hash_key(a) != hash_key(a.float())
    assert hash_key(a) != hash_key(a.reshape(3, 2))
    # dict order irrelevant, types distinguished
    assert hash_key({"a": 1, "b": [1, 2.0]}) == hash_key({"b": [1, 2.0], "a": 1})
    assert hash_key(1) != hash_key(1.0) != hash_key("1")
    assert hash_key(["ab", "c"]) != hash_key(["a", "bc"])
    assert hash_key([1, 2]) == hash_key((1, 2))
    # a sha256 hex digest
    k = hash_key("x")
    assert len(k) == 64 and int(k, 16) >= 0


def test_hash_key_rejects_unknown_type():
    with pytest.raises(TypeError, match="cannot hash"):
        hash_key(object())


def test_roundtrip_and_key_mismatch(tmp_path):
    t = {"x": torch.randn(5, 3, dtype=torch.float64), "y": torch.arange(5)}
    p = tmp_path / "sub" / "c.pt"
    save_tensor_atomic(p, t, key="k1")
    out = load_tensor_verified(p, "k1")
    assert out is not None and set(out) == {"x", "y"}
    assert torch.equal(out["x"], t["x"]) and out["x"].dtype == torch.float64
    assert torch.equal(out["y"], t["y"])
    assert load_tensor_verified(p, "k2") is None
    assert load_tensor_verified(tmp_path / "missing.pt", "k1") is None


def test_corrupted_file_is_none(tmp_path):
    p = tmp_path / "c.pt"
    x = torch.arange(4096, dtype=torch.float64)
    save_tensor_atomic(p, {"x": x}, key="k")
    raw = bytearray(p.read_bytes())
    # flip bytes inside the tensor payload (locate float 1000.0 in the file)
    needle = torch.tensor([1000.0], dtype=torch.float64).numpy().tobytes()
    pos = bytes(raw).find(needle)
    assert pos > 0
    raw[pos + 7] ^= 0xFF
    p.write_bytes(bytes(raw))
    assert load_tensor_verified(p, "k") is None
    # truncated file / garbage
    save_tensor_atomic(p, {"x": x}, key="k")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    assert load_tensor_verified(p, "k") is None
    p.write_bytes(b"not a torch file")
    assert load_tensor_verified(p, "k") is None


def test_checksum_detects_tampered_payload(tmp_path, monkeypatch):
    """A readable file whose tensors differ from the stored checksum is rejected."""
    p = tmp_path / "c.pt"
    save_tensor_atomic(p, {"x": torch.zeros(3)}, key="k")
    payload = torch.load(p, weights_only=True)
    payload["tensors"]["x"] = torch.ones(3)
    torch.save(payload, p)
    assert load_tensor_verified(p, "k") is None


def test_atomic_no_partial_file_on_error(tmp_path, monkeypatch):
    tmp_path = tmp_path / "atomic"
    p = tmp_path / "c.pt"
    save_tensor_atomic(p, {"x": torch.zeros(3)}, key="old")
    before = p.read_bytes()

    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        f.write(b"partial garbage")
        raise RuntimeError("disk full")

    monkeypatch.setattr(cache.torch, "save", failing_save)
    with pytest.raises(RuntimeError, match="disk full"):
        save_tensor_atomic(p, {"x": torch.ones(3)}, key="new")
    monkeypatch.setattr(cache.torch, "save", real_save)
    # the old file is untouched and no temporary file is left behind
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]
    assert torch.equal(load_tensor_verified(p, "old")["x"], torch.zeros(3))
    # a failure on a fresh path leaves nothing at all
    q = tmp_path / "fresh.pt"
    monkeypatch.setattr(cache.torch, "save", failing_save)
    with pytest.raises(RuntimeError):
        save_tensor_atomic(q, {"x": torch.ones(3)}, key="new")
    assert not q.exists() and sorted(os.listdir(tmp_path)) == ["c.pt"]


def test_save_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="tensors"):
        save_tensor_atomic(tmp_path / "c.pt", {"x": [1, 2]}, key="k")
    with pytest.raises(ValueError, match="key"):
        save_tensor_atomic(tmp_path / "c.pt", {"x": torch.zeros(1)}, key=3)
    assert not (tmp_path / "c.pt").exists()


def test_deferred_writes_are_readable_and_written_only_when_flushed(tmp_path):
    from lightning_pfd.cache import deferred_writes, write_deferred

    p, t = tmp_path / "c" / "e.pt", {"x": torch.arange(4.0)}
    with deferred_writes() as pending:
        save_tensor_atomic(p, t, "k")
        assert not p.exists()  # nothing on disk while validating
        assert torch.equal(load_tensor_verified(p, "k")["x"], t["x"])  # but reads see it
        assert load_tensor_verified(p, "other") is None
    assert not p.exists()
    write_deferred(pending)
    assert torch.equal(load_tensor_verified(p, "k")["x"], t["x"]) and not pending
    with deferred_writes():  # a failed validation: the pending entry is simply dropped
        save_tensor_atomic(tmp_path / "f.pt", t, "k")
    assert not (tmp_path / "f.pt").exists()
