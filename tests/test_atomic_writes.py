"""The one atomic write (``lightning_pfd.atomic``): every whole-file writer of the package goes
through it, a failed write leaves the old file and no temporary file, and a full disk names the
file that could not be written (the report's output, a cache entry and LIGHTNING_PFD_CACHE)."""
from __future__ import annotations

import ast
import errno
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_pfd.atomic import atomic_open, atomic_write
from test_reliability import _env

PKG = Path(__file__).resolve().parents[1] / "lightning_pfd"


def test_a_complete_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "f.json"
    atomic_write(p, "old")
    atomic_write(p, "néw")
    assert p.read_text(encoding="utf-8") == "néw"
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.json"]


@pytest.mark.parametrize("failure", ["enospc", "bug", "sigterm"])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, failure):
    p = tmp_path / "d" / "f.bin"
    atomic_write(p, b"old")
    raised = {"enospc": OSError(errno.ENOSPC, "No space left on device"), "bug": ValueError("bug"),
              "sigterm": SystemExit(143)}[failure]
    with pytest.raises(type(raised)) as info:
        with atomic_open(p) as f:
            f.write(b"half of the new")
            raise raised
    assert p.read_bytes() == b"old" and sorted(x.name for x in p.parent.iterdir()) == ["f.bin"]
    if failure == "enospc":  # the error names the target, not the temporary file
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(p)


def test_every_writer_of_the_package_uses_the_one_helper():
    """No module but ``atomic.py`` makes its own temporary file or renames one over a target."""
    found = []
    for path in PKG.rglob("*.py"):
        if path.name == "atomic.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("mkstemp", "NamedTemporaryFile", "fsync"):
                found.append(f"{path.relative_to(PKG)}:{node.lineno} {node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "savefig" and node.args and not isinstance(node.args[0], ast.Name):
                found.append(f"{path.relative_to(PKG)}:{node.lineno} savefig to a path")
    assert found == []


def test_a_full_cache_disk_names_the_file_and_the_cache_setting(tmp_path, monkeypatch, capsys):
    from lightning_pfd.launch.cli import disk_error

    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    entry = tmp_path / "cache" / "endpoints" / "abc.pt"
    assert disk_error(OSError(errno.ENOSPC, "No space left on device", str(entry)), None, ["fit"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {entry}: no space left on the device" in err
    assert f"this file is in the cache (LIGHTNING_PFD_CACHE={tmp_path / 'cache'})" in err
    # a file outside the cache gets no cache line
    assert disk_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "x.ckpt")),
                      None, ["fit"]) == 1
    assert "LIGHTNING_PFD_CACHE" not in capsys.readouterr().err


def _limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_report_out_on_a_full_disk_names_the_output(tmp_path):
    """``report --out`` that cannot be written (a file-size limit in a subprocess): the message
    names the output file, not the input run, and the run's files are unchanged."""
    from test_report import _write_csv  # a small logged run

    run = tmp_path / "run"
    _write_csv(run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "lightning_pfd", "report", str(run), "--out", str(out)],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=600,
                       preexec_fn=_limited)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{out}/" in r.stderr and "cannot be written" in r.stderr and "choose another --out" in r.stderr
    assert "Traceback" not in r.stderr and str(run) + ":" not in r.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not [p for p in out.rglob("*.tmp")]


def test_every_import_in_the_package_resolves_lazy_ones_included():
    """Every ``from .x import name`` of the package — those inside functions too, which importing
    a module does not run — names something its module has (a lazy import of a removed helper
    failed only when a sweep trial reached it)."""
    import importlib

    missing = []
    for path in PKG.rglob("*.py"):
        package = ".".join(path.relative_to(PKG.parent).parts[:-1])  # of a module and of an __init__
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            mod = importlib.import_module(target)
            for alias in node.names:
                if alias.name != "*" and not hasattr(mod, alias.name):
                    try:
                        importlib.import_module(f"{target}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.relative_to(PKG)}:{node.lineno} {target}.{alias.name}")
    assert missing == []
