"""Every command and import in README.md and docs/*.md, run in a reduced form.

* each ``python -m lightning_pfd ...`` line of a fenced shell block: ``fit`` (and LightningCLI's
  other subcommands) with ``--print_config`` (the embedded config names, every option and value
  parse; nothing trains); ``sweep``: its options parse and its sweep file loads; ``report``: its
  options parse (the run report's or the sweep report's parser); ``icr-sweep``, ``pite``: their
  options parse with the command's own parser. Lines with
  placeholders (``RUN_DIR``, ``...``, ``a|b``, shell variables) are listed as skipped, with that
  reason;
* each fenced ``python`` block: compiles, and its imports of ``lightning_pfd`` resolve (running
  the blocks themselves needs trained runs, CIFAR-10 or minutes: they are exercised by the tests
  of their topic).

This is the reduced form: a renamed option, a removed config, a misspelt class or function in a
doc fails here, in seconds.
"""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PREFIX = "python -m lightning_pfd"
PLACEHOLDERS = ("RUN_DIR", "...", "|", "$", "<", "HEAD_IP", "HEAD:")


def _blocks(path: Path):
    """(language, first line number, body) of every fenced block."""
    text = path.read_text()
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        yield m.group(1), text[:m.start()].count("\n") + 2, m.group(2)


def _commands():
    out = []
    for path in DOCS:
        for lang, line0, body in _blocks(path):
            if lang not in ("bash", "sh", "shell", "console", ""):
                continue
            joined = re.sub(r"\\\n\s*", " ", body)
            for k, line in enumerate(joined.splitlines()):
                i = line.find(PREFIX)
                if i < 0 or line.lstrip().startswith("#"):
                    continue
                cmd = line[i:]
                try:
                    argv = shlex.split(cmd, comments=True)[3:]
                except ValueError:
                    argv = None
                out.append(pytest.param(cmd.split("#")[0].strip(), argv,
                                        id=f"{path.name}:{line0 + k}:{' '.join((argv or ['?'])[:3])}"))
    return out


def _python_blocks():
    return [pytest.param(body, id=f"{path.name}:{line0}") for path in DOCS
            for lang, line0, body in _blocks(path) if lang == "python"]


def _skip_reason(cmd: str, argv):
    if argv is None:
        return "not a shell command line"
    for p in PLACEHOLDERS:
        if p in cmd:
            return f"a placeholder ({p!r}) stands for the user's own value"
    return None


@pytest.mark.parametrize("cmd, argv", _commands())
def test_documented_command_parses(cmd, argv, monkeypatch, tmp_path, capsys):
    reason = _skip_reason(cmd, argv)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(REPO)  # the docs run from the repository root
    argv = [a for a in argv if a not in ("--debug",)]
    if "--threads" in argv:  # taken off by the dispatcher (before or after the command name)
        i = argv.index("--threads")
        argv = argv[:i] + argv[i + 2:]
    name = argv[0] if argv and not argv[0].startswith("-") else "fit"
    rest = argv[1:] if argv and argv[0] == name else argv
    if name in ("fit", "validate", "test", "predict"):
        from lightning_pfd.commands.fit import main

        with pytest.raises(SystemExit) as info:
            main([name, *rest, "--print_config"])
        out = capsys.readouterr()
        assert info.value.code in (0, None), out.err[-2000:]
        assert "trainer:" in out.out and "model:" in out.out
    elif name == "sweep":
        from lightning_pfd.commands.sweep import build_parser
        from lightning_pfd.sweeps.spec import load_sweep

        args = build_parser().parse_args(rest)
        assert load_sweep(args.config, name=args.name).name
    elif name == "report":  # a run's report, or a sweep's (chosen by what is on disk)
        from lightning_pfd.analysis.sweep_report import build_parser as sweep_parser
        from lightning_pfd.commands.report import build_parser as run_parser

        parsed = []
        for parser in (run_parser, sweep_parser):
            try:
                parsed.append(parser().parse_args(rest))
            except SystemExit as e:  # --help exits 0
                if e.code == 0:
                    parsed.append("help")
        capsys.readouterr()
        assert parsed, f"neither the run report nor the sweep report accepts: {cmd}"
    elif name in ("icr-sweep", "pite"):
        import importlib

        mod = importlib.import_module(f"lightning_pfd.commands.{name.replace('-', '_')}")
        parser = getattr(mod, "build_parser", None) or getattr(mod, "_parser")
        parser().parse_args(rest)
    else:
        pytest.fail(f"unknown command {name!r} in the docs: {cmd}")


@pytest.mark.parametrize("body", _python_blocks())
def test_documented_python_block_compiles_and_its_imports_resolve(body):
    tree = ast.parse(body)
    import importlib

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_pfd"):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert alias.name == "*" or hasattr(mod, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}") is not None, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightning_pfd"):
                    importlib.import_module(alias.name)
