"""Every command and Python block of README.md and docs/**/*.md: parsed, and run in a reduced form.

Parse (seconds, no training):

* each ``python -m lightning_pfd ...`` line of a fenced shell block: ``fit`` (and LightningCLI's
  other subcommands) with ``--print_config``; ``sweep``: options parse and the sweep file loads;
  ``report``, ``icr-sweep``, ``pite``: options parse with the command's own parser. Lines with
  placeholders (``RUN_DIR``, ``...``, ``a|b``, shell variables) are skipped here;
* each fenced ``python`` block compiles and its ``lightning_pfd`` imports resolve.

Run (``test_documented_command_runs``, ``test_documented_python_block_runs``):

* commands: every logical line (``\\`` continuations and multi-line quoted strings joined,
  here-documents included) of a ``bash``/``sh``/``shell``/``console`` block, and the lines of an
  unlabelled block that start with ``python`` (after ``VAR=value`` / ``nice -n N``); a block
  marked ``skip`` as a whole is one (skipped) test. The commands of one block run in order,
  with ``bash``, in one workspace (as a user types them): a fresh temporary directory holding
  symlinks to the repository's top-level entries (``lightning_pfd``, ``configs``, ``callbacks``,
  ...), copies of ``docs/`` and ``experiments/`` (so nothing of the repository is written), and
  ``runs/quickstart``: the output of the session's reduced quickstart, ``QUICKSTART`` below (the
  README's first command, ``python -m lightning_pfd fit``, with three CLI options appended; when a
  block's reduced command is exactly ``QUICKSTART`` the session run is its result). Environment:
  one thread (``OMP_NUM_THREADS``, ``LIGHTNING_PFD_THREADS``), W&B offline, one session cache
  (``LIGHTNING_PFD_CACHE``). A command passes when it exits 0 and prints no traceback. Blocks
  whose (reduced) commands start alike share those runs (README.md and a docs page showing the
  same command run it once);
* Python blocks: executed in-process in a fresh copy of that workspace (current directory), in a
  new namespace that holds ``quickstart()`` -> ``(model, dm)``: the reduced quickstart's trained
  ``DiffusionModule`` (``runs/quickstart/checkpoints/last.ckpt``) and its datamodule, set up
  (e.g. ``<!-- docs-test: given: model, dm = quickstart() -->``). The same code in two pages
  runs once.

A command or block that needs more than ``TIMEOUT_S`` seconds is said in a warning (mark it reduced or
skip); only one that gives no answer in ``HANG_S`` seconds fails, naming the machine's load. Blocks in other languages
(``yaml``, ``text``: config excerpts and printed output) are not run.

Markers: HTML comments (invisible in the rendered page) on the lines directly above a block's
opening fence, one per line, any number stacked::

    <!-- docs-test: skip: REASON -->                 the whole block is not run (pytest skip, REASON)
    <!-- docs-test: skip `TEXT`: REASON -->          only the block's commands containing TEXT
    <!-- docs-test: reduced: + ARGS -->              ARGS appended to each ``python -m lightning_pfd``
                                                     command of the block (later options override
                                                     earlier ones: the CLI's documented rule)
    <!-- docs-test: reduced: OLD => NEW; A => B -->   these replacements in the block's text (each
                                                     OLD must occur), e.g. smaller sizes
    <!-- docs-test: reduced `TEXT`: ... -->          a reduction of the commands containing TEXT
    <!-- docs-test: given: PYTHON -->                Python run before a python block (in its
                                                     namespace): the names it takes from the text
                                                     around it

A block that needs a GPU, CIFAR-10, the network, a Ray cluster or more than a minute is marked
``skip`` with that reason or ``reduced``; an unmarked block that does not run fails, as does a
malformed marker, a marker that is not directly above a fence, a ``TEXT`` that selects no command
of its block, and an unmarked ``pip``/``ray``/``wandb``/``srun``/``sbatch``/``rm``/``git``
command (never run unmarked).
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PREFIX = "python -m lightning_pfd"
PLACEHOLDERS = ("RUN_DIR", "...", "|", "$", "<", "HEAD_IP", "HEAD:")
SHELL_LANGS = ("bash", "sh", "shell", "console")
QUICKSTART = "python -m lightning_pfd fit --trainer.max_epochs 3 --data.samples_per_epoch 256 --data.n_test 128"
#: the budget of one documented command or block: one over it is *said* (a warning: mark it
#: reduced or skip); it fails only past HANG_S, a hang guard sized for a slow, loaded machine
#: (a slow machine must not read as a broken install: issue 40 item 15)
TIMEOUT_S = 90
HANG_S = 900
COPIED = ("docs", "experiments")  # the workspace's own copies (commands may write there)
NEVER_UNMARKED = ("pip", "ray", "wandb", "srun", "sbatch", "rm", "git", "sudo")
MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|reduced|given)(?:\s+`([^`]+)`)?\s*:\s*(.*?)\s*-->")


# --------------------------------------------------------------------------------------------
# the blocks and their markers
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Marker:
    kind: str             # skip | reduced | given
    match: Optional[str]  # only the commands containing this text (None: the whole block)
    text: str


@dataclass(frozen=True)
class Block:
    path: Path
    lang: str
    line: int             # line number of the opening fence (1-based)
    body: str
    markers: Tuple[Marker, ...]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def marked(self, kind: str, command: Optional[str] = None) -> List[Marker]:
        return [m for m in self.markers if m.kind == kind
                and (m.match is None or (command is not None and m.match in command))]


_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def _doc_blocks(path: Path) -> List[Block]:
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for m in _FENCE.finditer(text):
        line = text[:m.start()].count("\n") + 1
        markers, k = [], line - 2
        while k >= 0 and MARKER.fullmatch(lines[k].strip()):
            kind, match, body = MARKER.fullmatch(lines[k].strip()).groups()
            markers.insert(0, Marker(kind, match, body))
            k -= 1
        out.append(Block(path, m.group(1), line, m.group(2), tuple(markers)))
    return out


BLOCKS = [b for path in DOCS for b in _doc_blocks(path)]


def _blocks(path: Path):
    """(language, first body line number, body) of every fenced block."""
    for b in BLOCKS:
        if b.path == path:
            yield b.lang, b.line + 1, b.body


def _command_word(command: str) -> str:
    """The program a command line runs (after VAR=value assignments and ``nice -n N``)."""
    try:
        words = shlex.split(command.splitlines()[0], comments=True)
    except ValueError:
        words = command.split()
    while words:
        if re.fullmatch(r"\w+=\S*", words[0]) or words[0] == "time":
            words = words[1:]
        elif words[0] == "nice":
            words = words[3:] if words[1:2] == ["-n"] else words[1:]
        else:
            break
    return words[0] if words else ""


def _closed(line: str) -> bool:
    """Whether every quote of a shell line is closed."""
    try:
        shlex.split(line)
        return True
    except ValueError:
        return False


def _block_commands(block: Block) -> List[Tuple[int, str]]:
    """(line number, command) of every command of a block: continuation lines and multi-line
    quoted strings joined, a here-document kept with the line that opens it; a block marked
    ``skip`` as a whole is one command (its text)."""
    if block.lang not in SHELL_LANGS and block.lang != "":
        return []
    if block.marked("skip"):
        return [(block.line + 1, block.body.strip())]
    lines, out, i = block.body.splitlines(), [], 0
    while i < len(lines):
        start, line = i, lines[i]
        while i + 1 < len(lines) and (line.rstrip().endswith("\\") or not _closed(line)):
            i += 1
            if line.rstrip().endswith("\\"):
                line = line.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            else:  # inside a quoted string: the newline is part of it
                line += "\n" + lines[i]
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if heredoc:
            while i + 1 < len(lines) and lines[i + 1].strip() != heredoc.group(1):
                i += 1
                line += "\n" + lines[i]
            if i + 1 < len(lines):
                i += 1
                line += "\n" + lines[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if block.lang == "" and _command_word(stripped) != "python":
            continue
        out.append((block.line + 1 + start, stripped))
    return out


def _split_comment(line: str) -> Tuple[str, str]:
    """(code, trailing comment) of one shell line: the first unquoted ``#`` after a blank."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), line[k:]
    return line.rstrip(), ""


def _replacements(text: str) -> List[Tuple[str, str]]:
    pairs = []
    for part in text.split(";"):
        if "=>" not in part:
            raise ValueError(f"a reduction is '+ ARGS' or 'OLD => NEW; ...', got {text!r}")
        old, new = part.split("=>", 1)
        pairs.append((old.strip(), new.strip()))
    return pairs


def _reduce(block: Block, text: str, command: Optional[str] = None) -> str:
    """``text`` (a command of the block, or the python block) with the block's reductions."""
    for m in block.marked("reduced", command):
        if m.text.startswith("+ "):
            if PREFIX in text and "\n" not in text:
                code, comment = _split_comment(text)
                text = f"{code} {m.text[2:].strip()}" + (f"  {comment}" if comment else "")
            continue
        for old, new in _replacements(m.text):
            assert old in text, f"{block.name}: reduction {old!r} => {new!r}: {old!r} is not in {text!r}"
            text = text.replace(old, new)
    return text


def _command_params():
    params = []
    for block in BLOCKS:
        for line, command in _block_commands(block):
            words = _command_word(command)
            params.append(pytest.param(block, line, command,
                                       id=f"{block.path.relative_to(REPO)}:{line}:{words}"))
    return params


# --------------------------------------------------------------------------------------------
# parse (no training)
# --------------------------------------------------------------------------------------------

def _commands():
    out = []
    for block in BLOCKS:
        if block.lang not in SHELL_LANGS + ("",):
            continue
        joined = re.sub(r"\\\n\s*", " ", block.body)
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
                                    id=f"{block.path.name}:{block.line + 1 + k}:{' '.join((argv or ['?'])[:3])}"))
    return out


def _python_blocks():
    return [pytest.param(b.body, id=f"{b.path.name}:{b.line + 1}") for b in BLOCKS if b.lang == "python"]


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
    if argv in (["--help"], ["-h"]):  # the top-level help (no LightningCLI)
        from lightning_pfd.commands import main as top

        assert top(argv) == 0
        assert "usage: python -m lightning_pfd" in capsys.readouterr().out
        return
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


def test_markers_are_well_formed_and_apply():
    """Every ``docs-test`` comment is a marker directly above a fence, and selects something."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        for k, line in enumerate(lines):
            if "docs-test" not in line:
                continue
            where = f"{path.relative_to(REPO)}:{k + 1}"
            m = MARKER.fullmatch(line.strip())
            assert m, f"{where}: not a marker: {line!r}"
            assert m.group(3), f"{where}: a marker needs its reason / reduction / code"
            j = k + 1
            while j < len(lines) and MARKER.fullmatch(lines[j].strip()):
                j += 1
            assert j < len(lines) and lines[j].startswith("```"), f"{where}: not directly above a fence"
    for block in BLOCKS:
        commands = [c for _, c in _block_commands(block)]
        for m in block.markers:
            if m.kind == "given":
                assert block.lang == "python", f"{block.name}: 'given' is for python blocks"
            if m.kind == "reduced" and not m.text.startswith("+ "):
                _replacements(m.text)
            if m.match is not None:
                assert any(m.match in c for c in commands), \
                    f"{block.name}: marker `{m.match}` selects no command of the block"


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------

def _env(cache: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # see conftest.py
    env.update(OMP_NUM_THREADS="1", LIGHTNING_PFD_THREADS="1", LIGHTNING_PFD_CACHE=str(cache),
               WANDB_MODE="offline", WANDB_SILENT="true", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    return env


def _bare_workspace(path: Path) -> Path:
    path.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name in ("runs",):
            continue
        if entry.name in COPIED:
            shutil.copytree(entry, path / entry.name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (path / entry.name).symlink_to(entry)
    return path


def _bash(command: str, cwd: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    start = time.monotonic()
    try:
        r = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer after {HANG_S} s (a hang, or a machine {_load()}): {command}")
    _over_budget(time.monotonic() - start, command)
    return r


def _load() -> str:
    try:
        return f"at load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:  # pragma: no cover - no load average on this platform
        return "of unknown load"


def _over_budget(took: float, what: str) -> None:
    """Say (never fail) that a documented command took longer than its budget."""
    if took > TIMEOUT_S:
        warnings.warn(f"{what}: {took:.0f} s, over the {TIMEOUT_S} s budget of a documented command "
                      f"({_load()}): mark it reduced or skip if it is slow on a quiet machine too")


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"{what}\nexit {result.returncode}\n{out[-3000:]}"
    assert "Traceback (most recent call last)" not in out, f"{what}\n{out[-3000:]}"


class Workspaces:
    """The session's workspaces: one per sequence of commands run (a block's commands up to
    one), each a copy of the one before its last command; the root is the reduced quickstart's."""

    def __init__(self, root: Path):
        self.root, self.cache = root, root / "cache"
        self.env = _env(self.cache)
        self.quickstart = _bare_workspace(root / "quickstart")
        self.quickstart_result = _bash(QUICKSTART, self.quickstart, self.env)
        self.states: Dict[tuple, Tuple[Path, subprocess.CompletedProcess]] = {}
        self.python_passed: set = set()  # the code of the python blocks that ran
        self._n = 0

    def fresh(self, parent: Optional[Path] = None) -> Path:
        """A copy of ``parent`` (default: the workspace after the reduced quickstart)."""
        _check(self.quickstart_result, QUICKSTART)
        self._n += 1
        dest = self.root / f"ws{self._n}"
        shutil.copytree(parent or self.quickstart, dest, symlinks=True)
        return dest

    def _state(self, commands: tuple) -> Tuple[Path, subprocess.CompletedProcess]:
        if not commands:
            return self.quickstart, self.quickstart_result
        if commands not in self.states:
            parent, before = self._state(commands[:-1])
            if before.returncode:
                earlier = commands[-2] if len(commands) > 1 else QUICKSTART
                pytest.fail(f"an earlier command of the block failed: {earlier}\n"
                            f"{(before.stderr or '')[-2000:]}")
            if commands == (QUICKSTART,):
                self.states[commands] = (parent, self.quickstart_result)  # the session run is it
            else:
                ws = self.fresh(parent)
                self.states[commands] = (ws, _bash(commands[-1], ws, self.env))
        return self.states[commands]

    def run(self, block: Block, line: int) -> subprocess.CompletedProcess:
        """Run the block's commands up to the one on ``line`` (skipped ones left out)."""
        return self.run_in(block, line)[1]

    def run_in(self, block: Block, line: int) -> Tuple[Path, subprocess.CompletedProcess]:
        """:meth:`run`, with the workspace the command ran in."""
        commands = []
        for k, command in _block_commands(block):
            skips = block.marked("skip", command)
            if skips:
                if k == line:
                    pytest.skip("; ".join(m.text for m in skips))
                continue
            word = _command_word(command)
            if word in NEVER_UNMARKED:
                pytest.fail(f"{block.name}:{k}: `{word}` is never run unmarked: mark it "
                            f"<!-- docs-test: skip `{word}`: REASON --> (or run it reduced)")
            reduced = _reduce(block, command, command)
            commands.append(reduced if "\n" in reduced else _split_comment(reduced)[0])
            if k == line:
                return self._state(tuple(commands))
        raise AssertionError(f"no command on line {line} of {block.name}")

    def model_and_data(self, ws: Path):
        """The reduced quickstart's trained module and its datamodule (set up), as ``icr-sweep
        --ckpt runs/quickstart/checkpoints/last.ckpt --data runs/quickstart/config.yaml`` loads them."""
        from lightning_pfd.commands.icr_sweep import build_datamodule, load_module

        dm, net = build_datamodule(str(ws / "runs/quickstart/config.yaml"), None)
        model = load_module(str(ws / "runs/quickstart/checkpoints/last.ckpt"), net,
                            "lightning_pfd.modules.DiffusionModule")
        return model, dm


@pytest.fixture(scope="session")
def workspaces(tmp_path_factory):
    return Workspaces(tmp_path_factory.mktemp("docs_run"))


@pytest.mark.parametrize("block, line, command", _command_params())
def test_documented_command_runs(block, line, command, workspaces):
    result = workspaces.run(block, line)
    _check(result, f"{block.name} (line {line}): {_reduce(block, command, command)}")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in BLOCKS if b.lang == "python"])
def test_documented_python_block_runs(block, workspaces, monkeypatch):
    skips = block.marked("skip")
    if skips:
        pytest.skip("; ".join(m.text for m in skips))
    code = "\n".join(m.text for m in block.marked("given")) + "\n" + _reduce(block, block.body)
    if code in workspaces.python_passed:  # the same code in another page (README and docs/)
        return
    ws = workspaces.fresh()
    monkeypatch.chdir(ws)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(workspaces.cache))
    monkeypatch.syspath_prepend(str(ws))
    namespace = {"__name__": "__docs__", "quickstart": lambda: workspaces.model_and_data(ws)}
    start = time.monotonic()  # pytest-timeout (pyproject) stops a block that hangs
    exec(compile(code, block.name, "exec"), namespace)
    _over_budget(time.monotonic() - start, block.name)
    workspaces.python_passed.add(code)


# --------------------------------------------------------------------------------------------
# the machinery itself
# --------------------------------------------------------------------------------------------

def _synthetic(body: str, markers=(), lang: str = "bash") -> Block:
    return Block(REPO / "README.md", lang, 1, body, tuple(Marker(*m) for m in markers))


def test_commands_of_a_block_join_continuations_quotes_and_here_documents():
    block = _synthetic("# a comment\npython -m lightning_pfd fit \\\n    --config quickstart  # note\n"
                       "python -c \"\nprint(1)\n\"\ncat <<'EOF'\na # b\nEOF\n\necho done\n")
    assert _block_commands(block) == [
        (3, "python -m lightning_pfd fit --config quickstart  # note"),
        (5, "python -c \"\nprint(1)\n\""),
        (8, "cat <<'EOF'\na # b\nEOF"),
        (12, "echo done")]
    unlabelled = _synthetic("lightning_pfd/  cli.py python -m lightning_pfd\nOMP_NUM_THREADS=1 nice -n 5 python x.py\n",
                            lang="")
    assert _block_commands(unlabelled) == [(3, "OMP_NUM_THREADS=1 nice -n 5 python x.py")]
    assert _command_word("OMP_NUM_THREADS=1 nice -n 5 python x.py") == "python"


def test_reductions_append_before_the_comment_and_replace_only_what_is_there():
    block = _synthetic("", [("reduced", "fit", "+ --trainer.max_epochs 1"), ("reduced", None, "RUN => runs/q")])
    assert _reduce(block, "python -m lightning_pfd fit RUN  # a run", "python -m lightning_pfd fit RUN  # a run") \
        == "python -m lightning_pfd fit runs/q --trainer.max_epochs 1  # a run"
    assert _reduce(block, "python -m lightning_pfd report RUN", "python -m lightning_pfd report RUN") \
        == "python -m lightning_pfd report runs/q"  # `fit` selects only the fit line's append
    with pytest.raises(AssertionError, match="is not in"):
        _reduce(block, "python -m lightning_pfd report x", "python -m lightning_pfd report x")
    with pytest.raises(ValueError, match="OLD => NEW"):
        _replacements("range(64) -> range(2)")


def test_a_block_that_does_not_run_fails_unless_marked(workspaces):
    failing = _synthetic("python -c 'import sys; sys.exit(3)'\n")
    with pytest.raises(AssertionError, match="exit 3"):
        _check(workspaces.run(failing, 2), "synthetic")
    traceback = _synthetic("python -c 'import sys; raise SystemExit(0) if 0 else print(\"Traceback (most recent call last)\")'\n")
    with pytest.raises(AssertionError, match="Traceback"):
        _check(workspaces.run(traceback, 2), "synthetic")
    with pytest.raises(pytest.fail.Exception, match="never run unmarked"):
        workspaces.run(_synthetic("pip install nothing-at-all\n"), 2)
    with pytest.raises(pytest.skip.Exception, match="the reason"):
        workspaces.run(_synthetic("pip install nothing-at-all\n", [("skip", "pip", "the reason")]), 2)
    runs = _synthetic("test -f runs/quickstart/checkpoints/last.ckpt && python -c 'print(2 + 2)'\n")
    assert workspaces.run(runs, 2).stdout.strip() == "4"


# --------------------------------------------------------------------------------------------
# what the documented runs leave behind (the runs above, shared)
# --------------------------------------------------------------------------------------------

def _documented(path: str, text: str) -> Tuple[Block, int]:
    """The block of ``path`` and the line of its command containing ``text``."""
    for block in BLOCKS:
        if block.path == REPO / path:
            for line, command in _block_commands(block):
                if text in command:
                    return block, line
    raise AssertionError(f"no command with {text!r} in {path}")


def _tree(root: Path) -> Dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_run_dir_moves_every_output_and_leaves_the_quickstart_alone(workspaces):
    """README: ``fit --data.init_args.n_train 4096 --run_dir runs/quickstart-n4096`` runs next to
    the quickstart (a second fit into runs/quickstart would be refused) and writes config, logs,
    checkpoints, per-unit records and report into its own folder only."""
    ws, result = workspaces.run_in(*_documented("README.md", "--run_dir runs/quickstart-n4096"))
    _check(result, "fit --run_dir")
    run = ws / "runs/quickstart-n4096"
    cfg = (run / "config.yaml").read_text()
    assert "n_train: 256" in cfg and "run_dir: runs/quickstart-n4096" in cfg  # 4096, reduced
    assert "runs/quickstart/" not in cfg and "save_dir: runs/quickstart\n" not in cfg
    assert (run / "checkpoints/last.ckpt").is_file()
    assert list(run.glob("csv/version_*/metrics.csv"))
    assert list(run.glob("wandb/offline-run-*/run-*.wandb"))
    assert sorted(p.name for p in (run / "per_unit").iterdir()) == \
        ["icr_icr", "mem_ratio", "pfd_e_gen", "pfd_e_mem"]
    assert (run / "report/report.md").is_file()
    assert "name: quickstart-n4096" in cfg  # the W&B run's name
    before = _tree(workspaces.quickstart / "runs/quickstart")
    assert _tree(ws / "runs/quickstart") == before  # the earlier run: not a byte changed
    assert sorted(p.name for p in (ws / "runs").iterdir()) == ["quickstart", "quickstart-n4096"]


def _sections(md: str) -> Dict[str, str]:
    parts = re.split(r"^## ", md, flags=re.M)
    return {p.split("\n", 1)[0]: p for p in parts[1:]}


def test_fit_report_and_report_command_agree_with_relative_paths(workspaces):
    """The run's one report (RUN/report, written by fit) and ``report RUN`` rebuilt from the logs:
    same title, regime, events and the same row for every curve the monitor tracks; the rebuilt
    one only adds what it read (Run line, Input, other logged metrics, the settings file).
    Neither holds a machine path."""
    # docs/configuration.md: the quickstart, resumed to 4 epochs, then `report runs/quickstart`
    ws, out = workspaces.run_in(*_documented("docs/configuration.md", "report RUN_DIR"))
    _check(out, "report runs/quickstart")
    fit_md = (ws / "runs/quickstart/report/report.md").read_text()
    assert not list((ws / "runs/quickstart/wandb").glob("offline-run-*/report"))  # one location
    rebuilt = (ws / "runs/quickstart/report-2/report.md").read_text()  # the fit's report is kept
    for md in (fit_md, rebuilt, (ws / "runs/quickstart/report-2/events.json").read_text()):
        assert str(ws) not in md and str(REPO) not in md and "/tmp/" not in md
    assert fit_md.splitlines()[0] == rebuilt.splitlines()[0] == "# Training-dynamics report"
    a, b = _sections(fit_md), _sections(rebuilt)
    for name in ("Regime", "Events", "Figures"):
        assert a[name] == b[name], name
    assert set(a["Metrics"].splitlines()) <= set(b["Metrics"].splitlines())
    assert "`../wandb/offline-run-" in rebuilt  # the log it read, relative to report.md
    segment = re.search(r"`(\.\./wandb/offline-run-[^`]+\.wandb)`", rebuilt).group(1)
    assert (ws / "runs/quickstart/report-2" / segment).resolve().is_file()


def test_resume_prints_no_false_deletion_warning(workspaces):
    """Lightning's CSV writer says "Previous log files ... will be deleted" when it starts in the
    resumed version directory; continue_loggers keeps every row, so the message is not shown."""
    ws, result = workspaces.run_in(*_documented("docs/configuration.md", "--ckpt_path last"))
    _check(result, "fit --ckpt_path last")
    out = result.stdout + result.stderr
    assert "CSV log continues in" in out
    assert "Previous log files" not in out
    rows = list((ws / "runs/quickstart").glob("csv/version_0/metrics.csv"))
    assert rows and rows[0].read_text().count("\n") > 4  # the rows were kept, not deleted
