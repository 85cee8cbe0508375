"""The package's import graph: no cycle, and no module importing a layer above its own.

The graph is read from the source with :mod:`ast` (every ``import`` / ``from ... import``
statement, module-level or inside a function), so a lazy import counts like any other. Importing
``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so those are edges too (except a
package's own modules importing it). ``importlib.import_module(name)`` with a computed name is
not seen: the command table in ``lightning_pfd/commands/__init__.py`` is the only one.

The layer table is documented in docs/architecture.md; keep both in step.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "lightning_pfd"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: bottom to top; a module may import its own layer or a lower one. A module belongs to the
#: entry with the longest matching prefix. ``launch`` (the LightningCLI, the fit pre-flight, the
#: shared error handling) sits under both ``sweeps`` and ``commands``: a sweep runs its fits
#: through ``launch.cli``, and the ``sweep`` command runs a sweep, so they import one way.
LAYERS = [
    ("foundation", ["lightning_pfd", "lightning_pfd.errors", "lightning_pfd.validation", "lightning_pfd.keys",
                    "lightning_pfd.contracts", "lightning_pfd.threads", "lightning_pfd.locks",
                    "lightning_pfd.cache", "lightning_pfd.checkpoint", "lightning_pfd.classpath"]),
    ("core", ["lightning_pfd.nets", "lightning_pfd.diffusion"]),
    ("metrics", ["lightning_pfd.metrics"]),
    ("evaluation", ["lightning_pfd.evaluation"]),
    ("analysis", ["lightning_pfd.analysis"]),
    ("modules", ["lightning_pfd.modules"]),
    ("data", ["lightning_pfd.data"]),
    ("callbacks", ["lightning_pfd.callbacks"]),
    ("launch", ["lightning_pfd.launch"]),
    ("sweeps", ["lightning_pfd.sweeps"]),
    ("commands", ["lightning_pfd.commands"]),
    ("entry points", ["lightning_pfd.cli", "lightning_pfd.__main__"]),
]

#: layers whose modules must not import these third-party packages (DESIGN: the math, the
#: metrics and the evaluations are usable from a notebook without Lightning or W&B)
NO_FRAMEWORK = {"core": ("lightning", "pytorch_lightning", "wandb"),
                "metrics": ("lightning", "pytorch_lightning", "wandb"),
                "evaluation": ("lightning", "pytorch_lightning", "wandb"),
                "analysis": ("lightning", "pytorch_lightning")}


def _modules() -> dict:
    """{dotted name: (path, is_package)} of every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _imports(name: str, path: Path, is_pkg: bool, modules: dict):
    """(target module, line, external top-level name or None) of every import in ``path``."""
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{mod}.{alias.name}"
                yield (sub if sub in modules else mod), node.lineno


def import_graph():
    """{module: {imported internal module: first line}} and {module: {third-party top name}}."""
    modules = _modules()
    internal, external = {m: {} for m in modules}, {m: set() for m in modules}
    for name, (path, is_pkg) in modules.items():
        for target, line in _imports(name, path, is_pkg, modules):
            top = target.split(".")[0]
            if top != PACKAGE:
                external[name].add(top)
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the module and every package __init__ above it
                dep = ".".join(parts[:i])
                if dep in modules and dep != name and not (name + ".").startswith(dep + "."):
                    internal[name].setdefault(dep, line)
    return internal, external


def layer_of(module: str) -> int:
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, index = p, i
    return index


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


GRAPH, EXTERNAL = import_graph()


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m) is None] == []


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{src}:{line} ({LAYERS[layer_of(src)][0]}) imports {dst} ({LAYERS[layer_of(dst)][0]})"
              for src, deps in sorted(GRAPH.items()) for dst, line in sorted(deps.items())
              if layer_of(dst) > layer_of(src)]
    assert upward == []


def test_math_metrics_and_evaluations_import_no_framework():
    names = [name for name, _ in LAYERS]
    bad = [f"{m} imports {pkg}" for m, pkgs in sorted(EXTERNAL.items())
           for pkg in sorted(pkgs) if pkg in NO_FRAMEWORK.get(names[layer_of(m)], ())]
    assert bad == []


# ------------------------------------------------------------------ the checker itself
def _graph_of(tmp_path, files: dict):
    """Run the checker on a throw-away package laid out as ``files``."""
    global ROOT
    for rel, text in files.items():
        p = tmp_path / PACKAGE / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    saved, ROOT = ROOT, tmp_path / PACKAGE
    try:
        return import_graph()
    finally:
        ROOT = saved


def test_the_checker_sees_lazy_relative_and_package_imports(tmp_path):
    graph, external = _graph_of(tmp_path, {
        "__init__.py": "",
        "errors.py": "def f():\n    from .metrics import tails  # lazy, upward\n",
        "metrics/__init__.py": "from .tails import x\n",
        "metrics/tails.py": "import numpy\nfrom ..errors import E\nx = 1\n",
        "cli.py": "from lightning_pfd.metrics.tails import x\nimport wandb.sdk\n",
    })
    assert graph["lightning_pfd.errors"] == {"lightning_pfd.metrics": 2, "lightning_pfd.metrics.tails": 2}
    assert graph["lightning_pfd.metrics.tails"] == {"lightning_pfd.errors": 2}
    assert "lightning_pfd.metrics" not in graph["lightning_pfd.metrics.tails"]  # its own package
    assert set(graph["lightning_pfd.cli"]) == {"lightning_pfd.metrics", "lightning_pfd.metrics.tails"}
    assert external["lightning_pfd.cli"] == {"wandb"} and external["lightning_pfd.metrics.tails"] == {"numpy"}
    assert _cycles(graph) == [["lightning_pfd.errors", "lightning_pfd.metrics", "lightning_pfd.metrics.tails"]]
    up = [(s, d) for s, deps in graph.items() for d in deps if layer_of(d) > layer_of(s)]
    assert ("lightning_pfd.errors", "lightning_pfd.metrics.tails") in up


@pytest.mark.parametrize("module, layer", [("lightning_pfd.commands.sweep", "commands"),
                                           ("lightning_pfd.launch.cli", "launch"),
                                           ("lightning_pfd.sweeps.trial", "sweeps"),
                                           ("lightning_pfd", "foundation"),
                                           ("lightning_pfd.diffusion.families", "core")])
def test_the_longest_prefix_decides_the_layer(module, layer):
    assert LAYERS[layer_of(module)][0] == layer


def test_every_source_compiles_without_warnings():
    """No invalid escape sequence (``"\\|"`` in a non-raw string): Python warns about it today and
    will refuse it; the scripts beside the package count too."""
    import warnings

    files = sorted(ROOT.rglob("*.py")) + sorted((ROOT.parent / "experiments").glob("*.py")) \
        + sorted((ROOT.parent / "benchmarks").glob("*.py")) + sorted((ROOT.parent / "tests").glob("*.py"))
    bad = []
    for path in files:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SyntaxWarning)
            warnings.simplefilter("error", DeprecationWarning)  # Python < 3.12 names it so
            try:
                compile(path.read_text(), str(path), "exec", dont_inherit=True)
            except SyntaxError as e:
                bad.append(f"{path.relative_to(ROOT.parent)}:{e.lineno}: {e.msg}")
    assert not bad, bad


#: config paths of the command line (a model's, a datamodule's or a callback's argument)
CLI_PATH = __import__("re").compile(r"\b(model|data)\.init_args\b|trainer\.(callbacks|logger)\[")


def _code_strings(path: Path) -> list:
    """(line, text) of the string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


#: where a config path may be written: the command line (its one place, launch/paths.py; its
#: parser's hints and help), and the commands and sweeps that write config overrides themselves
CONFIG_PATH_PLACES = ("launch/paths.py", "launch/cli.py", "launch/fit_help.py", "commands/", "sweeps/")


def test_the_library_names_arguments_not_config_paths():
    """Outside the command line, the library names its own arguments in errors and messages
    (``lr``; ``model.lr`` for the model's); only launch/paths.py knows where a value sits in a
    config (``model.init_args.lr``, ``trainer.callbacks[Name]``, ``trainer.logger[Name]``)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(CONFIG_PATH_PLACES):
            found += [f"{path.relative_to(ROOT.parent)}:{line}: {text[:60]!r}"
                      for line, text in _code_strings(path) if CLI_PATH.search(text)]
    assert not found, found


def test_the_config_path_check_sees_a_path(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""Doc: model.init_args.lr is fine here."""\nraise ValueError("model.init_args.lr: bad")\n')
    assert [t for _, t in _code_strings(bad) if CLI_PATH.search(t)] == ["model.init_args.lr: bad"]


# ----------------------------------------------------------------------------- one measurement contract
def _classes(sub: str):
    """(path, ast.ClassDef) of every class in the package folder ``sub``."""
    for path in sorted((ROOT / sub).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                yield path, node


def _measure_signatures(sub: str) -> list:
    """``(where, positional parameter names)`` of every method named ``measure`` under ``sub``."""
    out = []
    for path, cls in _classes(sub):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "measure":
                args = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
                if fn.args.vararg or fn.args.kwarg:
                    args.append("*")
                out.append((f"{path.relative_to(ROOT.parent)}:{cls.name}", args))
    return out


def test_every_measure_of_an_evaluation_is_the_contract():
    """Every ``measure`` in evaluation/ is the measurement contract's ``(model, comm)``: the
    built-in evaluations implement it themselves (no adapter classes)."""
    sigs = _measure_signatures("evaluation")
    assert len(sigs) >= 5, sigs  # the protocol and the four built-in evaluations
    assert [w for w, args in sigs if args != ["self", "model", "comm"]] == []


def test_no_subclass_of_the_evaluation_monitor_in_callbacks():
    """The shipped monitors are configurations of EvaluationMonitor (callbacks/presets.py), not
    subclasses, and no class adapts an evaluation to the contract (``...Measure``)."""
    subclasses = [f"{p.name}:{c.name}" for p, c in _classes("callbacks")
                  if any(getattr(b, "id", getattr(b, "attr", None)) == "EvaluationMonitor" for b in c.bases)]
    adapters = [f"{p.name}:{c.name}" for sub in ("callbacks", "evaluation") for p, c in _classes(sub)
                if c.name.endswith("Measure")]
    assert subclasses == [] and adapters == []


def test_the_contract_checks_can_fail(tmp_path, monkeypatch):
    """The two checks above see a wrong signature and a subclass."""
    (tmp_path / "evaluation").mkdir()
    (tmp_path / "evaluation" / "e.py").write_text("class E:\n    def measure(self, model, rank, world):\n        pass\n")
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "c.py").write_text("class G(monitor.EvaluationMonitor):\n    pass\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _measure_signatures("evaluation") == [(f"{tmp_path.name}/evaluation/e.py:E",
                                                   ["self", "model", "rank", "world"])]
    with pytest.raises(AssertionError, match="c.py:G"):
        test_no_subclass_of_the_evaluation_monitor_in_callbacks()
