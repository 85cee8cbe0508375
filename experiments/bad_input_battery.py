"""Bad-input battery: what a new user types wrong, and whether lightning_pfd fails early and clearly.

Every case runs in its own fresh directory (the subprocess's working directory, with its own
``$LIGHTNING_PFD_CACHE`` inside it) as ``python -m lightning_pfd ...`` or a short ``python -c``
(Python API), sequentially, with a timeout. Before and after the case every file of that
directory is hashed (sha256), so the battery sees any file a failed run writes (config.yaml,
logger directories, checkpoints, cache entries) and any change to the files of an earlier run
that a case starts from (a finished tiny run is built once and copied in where a case needs it).

For each case it records the exit status (or the exception type for the Python API), the first
line of the message, whether a traceback was printed, the files created / changed / deleted and
a verdict:

* ``fails early + clear``: exit status 2 (a ConfigError/ValueError naming the field for the
  Python API), no traceback, nothing written, the message names the field (and says
  "did you mean" where the case's bad value is close to an accepted one);
* ``works``: an input that is actually valid ran (exit 0), or a documented partial result
  (``report`` on a truncated log, ``sweep --aggregate-only`` with a missing trial: exit 1,
  earlier files untouched);
* ``PROBLEM``: anything else (traceback, late failure after training started, files written or
  damaged, exit status other than 2, message without the field or without the suggestion).

Usage (from the repository root, in the project's virtualenv; ~10 minutes on 2 CPU cores):

    OMP_NUM_THREADS=1 python experiments/bad_input_battery.py --out /tmp/battery

Writes ``experiments/results/bad_input_battery.json`` (all results), ``DIR/table.md`` and
updates the table and the problem list of ``docs/reliability.md`` between its
``<!-- battery:... -->`` markers and README's sentence between ``<!-- battery-readme -->`` markers
(``--no-docs`` to skip; ``--docs-only`` rewrites them from the recorded JSON). ``--only ID[,ID...]`` / ``--area AREA``
run a subset (the JSON and docs are then not rewritten unless ``--write`` is given; ``--json
PATH`` writes the results elsewhere, e.g. a subset's own file; ``--merge`` replaces the subset's
cases in the recorded JSON, keeps the others marked ``carried``, and rewrites JSON and docs).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "lightning_pfd"
REPRESENTATION = PKG / "configs" / "callbacks" / "representation.yaml"
RESULTS_JSON = REPO / "experiments" / "results" / "bad_input_battery.json"
DOCS = REPO / "docs" / "reliability.md"
PY = sys.executable

# --------------------------------------------------------------------------------------------
# configs and fixtures
# --------------------------------------------------------------------------------------------
TINY = {
    "seed_everything": 0,
    "trainer": {
        "max_epochs": 1, "accelerator": "cpu", "devices": 1,
        "limit_train_batches": 2, "limit_val_batches": 1,
        "default_root_dir": "run", "enable_progress_bar": False, "enable_model_summary": False,
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                   "init_args": {"save_dir": "run", "name": "csv"}},
        "callbacks": [{"class_path": "lightning_pfd.callbacks.EpochCheckpoint",
                       "init_args": {"dirpath": "run/checkpoints"}}],
    },
    "model": {"class_path": "lightning_pfd.modules.DiffusionModule",
              "init_args": {"net": {"class_path": "lightning_pfd.nets.MLPNet",
                                    "init_args": {"dim": 64, "hidden": 32, "depth": 2}},
                            "num_steps": 6}},
    "data": {"class_path": "lightning_pfd.data.DigitsDataModule",
             "init_args": {"as_vector": True, "batch_size": 32}},
}

# ICR on the 64-d digit vectors, well posed and cheap (the quickstart's settings)
ICR_OK = {"num_images": 64, "views_per_image": 4, "d_proj": 16, "image_shape": [1, 8, 8],
          "level": 1}


def _yaml_dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False)


def tiny_config(overrides: Optional[dict] = None, callbacks: Optional[list] = None,
                data: Optional[dict] = None, net: Optional[dict] = None) -> dict:
    """The tiny digits config with dotted-key overrides, extra callbacks, another data/net."""
    cfg = json.loads(json.dumps(TINY))
    if data is not None:
        cfg["data"] = data
    if net is not None:
        cfg["model"]["init_args"]["net"] = net
    for name, args in callbacks or []:  # a bare name is one of lightning_pfd.callbacks
        cfg["trainer"]["callbacks"].append(
            {"class_path": name if "." in name else f"lightning_pfd.callbacks.{name}",
             "init_args": dict(args)})
    for dotted, value in (overrides or {}).items():
        node = cfg
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return cfg


def _cfg_desc(kw: dict) -> str:
    parts = []
    if kw.get("overrides"):
        parts.append("with " + ", ".join(f"{k}={v!r}" for k, v in kw["overrides"].items()))
    if kw.get("net"):
        parts.append(f"net {kw['net']['class_path'].rsplit('.', 1)[-1]}({_args(kw['net'])})")
    if kw.get("data"):
        parts.append(f"data {kw['data']['class_path'].rsplit('.', 1)[-1]}({_args(kw['data'])})")
    for name, args in kw.get("callbacks") or []:
        parts.append(f"+ callback {name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    return (" " + "; ".join(parts)) if parts else ""


def _args(spec: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in (spec.get("init_args") or {}).items())


def write_config(name: str = "tiny.yaml", **kw) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_text(_yaml_dump(tiny_config(**kw)))
    setup.describe = f"{name}: the tiny digits config" + _cfg_desc(kw)
    return setup


def write_text(name: str, text: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    setup.describe = f"{name}: text {text[:60]!r}"
    return setup


def write_bytes(name: str, data: bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_bytes(data)
    setup.describe = f"{name}: {len(data)} bytes"
    return setup


def make_dir(name: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).mkdir(parents=True, exist_ok=True)
    setup.describe = f"{name}/: an empty directory"
    return setup


_NPZ_DESC = {"ok": "'x', float32 in [-1, 1]", "nan": "'x', float32 with 3 NaN",
             "255": "'x', float32 in [0, 255]", "int64": "'x', int64 in [0, 255]",
             "badkey": "'images'", "ok2": "'x', float32 in [-1, 1], x[0, 0] changed"}
_CKPT_DESC = {"empty": "0 bytes", "truncated": "the first half of last.ckpt", "text": "a text file",
              "flipped": "last.ckpt with 8 bytes flipped inside a tensor",
              "foreign": "torch.save of a dict without state_dict"}


def tensor_npz(name: str, kind: str) -> Callable[[Path], None]:
    """An .npz of 200 64-d vectors: ``ok`` in [-1, 1], ``nan`` with NaNs, ``255`` float pixels,
    ``int64`` integers, ``badkey`` stored under an unknown key."""
    def setup(d: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, size=(200, 64)).astype(np.float32)
        key = "x"
        if kind == "nan":
            x[[3, 17, 101], 5] = np.nan
        elif kind == "255":
            x = np.round((x + 1) * 127.5).astype(np.float32)
        elif kind == "int64":
            x = np.round((x + 1) * 127.5).astype(np.int64)
        elif kind == "badkey":
            key = "images"
        elif kind == "ok2":  # the "ok" data with one value changed
            x[0, 0] = 0.5
        np.savez(d / name, **{key: x})
    setup.describe = f"{name}: 200 x 64 array under key " + _NPZ_DESC[kind]
    return setup


def copy_fixture(fixture: Path) -> Callable[[Path], None]:
    """Copy the finished earlier run (tiny.yaml + run/) into the case directory."""
    def setup(d: Path) -> None:
        for p in fixture.iterdir():
            if p.is_dir():
                shutil.copytree(p, d / p.name)
            else:
                shutil.copy2(p, d / p.name)
    setup.describe = "the finished earlier run: tiny.yaml + run/ (checkpoints/last.ckpt, csv/version_0)"
    return setup


def ckpt_variant(name: str, kind: str, fixture: Path) -> Callable[[Path], None]:
    """A damaged copy of the earlier run's last.ckpt: empty, truncated, text, flipped, foreign."""
    def setup(d: Path) -> None:
        src = (fixture / "run" / "checkpoints" / "last.ckpt").read_bytes()
        out = d / name
        if kind == "empty":
            out.write_bytes(b"")
        elif kind == "truncated":
            out.write_bytes(src[: len(src) // 2])
        elif kind == "text":
            out.write_text("epoch=3 step=750 val_loss=0.12\nthis is my training log, not a checkpoint\n")
        elif kind == "flipped":
            out.write_bytes(_flip_tensor_bytes(src))
        elif kind == "foreign":
            import torch

            torch.save({"weights": torch.zeros(4, 4), "epoch": 3}, out)
        else:  # pragma: no cover
            raise ValueError(kind)
    setup.describe = f"{name}: " + _CKPT_DESC[kind]
    return setup


def _flip_tensor_bytes(data: bytes) -> bytes:
    """Flip 8 bytes in the middle of the largest tensor storage of a torch zip checkpoint."""
    import io

    zf = zipfile.ZipFile(io.BytesIO(data))
    info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    head = data[info.header_offset: info.header_offset + 30]
    n_name = int.from_bytes(head[26:28], "little")
    n_extra = int.from_bytes(head[28:30], "little")
    start = info.header_offset + 30 + n_name + n_extra + info.file_size // 2
    b = bytearray(data)
    for i in range(start, start + 8):
        b[i] ^= 0xFF
    return bytes(b)


def truncate_log(fixture: Path) -> Callable[[Path], None]:
    """The earlier run, with its metrics.csv cut in the middle of its last row (a killed run)."""
    def setup(d: Path) -> None:
        copy_fixture(fixture)(d)
        m = next((d / "run").rglob("metrics.csv"))
        text = m.read_bytes()
        m.write_bytes(text[: len(text) - max(5, len(text.splitlines()[-1]) // 2)])
    setup.describe = "the finished earlier run with metrics.csv cut in the middle of its last row"
    return setup


def pite_results(out: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        o = d / out
        o.mkdir(parents=True)
        (o / "results.json").write_text('{"eta": 0.975, "sbm": {"rmsqe": 3.1}}\n')
        (o / "table.md").write_text("| Metric | SBM | LIM |\n|---|---|---|\n| RMSQE | 3.1 | 4.2 |\n")
    setup.describe = f"{out}/results.json + table.md of an earlier pite run"
    return setup


HOLDERS: List[subprocess.Popen] = []  # lock-holding processes started by a case's setup
HOLD = ("import sys, time\nfrom lightning_pfd.locks import acquire\nacquire(sys.argv[1], 'run', 'dir')\n"
        "print('held', flush=True)\ntime.sleep(600)\n")


def hold_lock(directory: str) -> Callable[[Path], None]:
    """Another process (started here, stopped after the case) holds the lock of ``directory``."""
    def setup(d: Path) -> None:
        p = subprocess.Popen([PY, "-c", HOLD, str(d / directory)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        p.stdout.readline()
        HOLDERS.append(p)
    setup.describe = f"another process holds the lock of {directory}/ (a fit still running)"
    return setup


def stale_lock(directory: str) -> Callable[[Path], None]:
    """The lock file of a fit that was SIGKILLed: its pid no longer runs on this host."""
    def setup(d: Path) -> None:
        import socket

        (d / directory).mkdir(parents=True, exist_ok=True)
        dead = subprocess.Popen([PY, "-c", "pass"])
        dead.wait()
        (d / directory / ".lightning_pfd.lock").write_text(json.dumps(
            {"pid": dead.pid, "host": socket.gethostname(), "started": time.time() - 60,
             "command": "python -m lightning_pfd fit --config tiny.yaml", "what": "run"}) + "\n")
    setup.describe = f"{directory}/.lightning_pfd.lock of a killed fit (its pid is gone)"
    return setup


def finished_sweep(name: str, ran: List[str], deleted: List[str], never: List[str]) -> Callable[[Path], None]:
    """``runs/<name>/`` of a finished sweep over the tiny config: ``sweep.json``, the trials of
    ``ran`` with their ``trial_result.json`` and the earlier ``sweep_results.json`` recording them
    (and those of ``deleted``, whose directories are then removed) as ok; ``never``: listed, not run."""
    def setup(d: Path) -> None:
        write_sweep_file("sw.yaml", {"data.init_args.n_train": [16, 24, 32]})(d)
        sweep = d / "runs" / name
        sweep.mkdir(parents=True)
        ids = ran + deleted + never
        (sweep / "sweep.json").write_text(json.dumps({"name": name, "trials": [
            {"trial_id": t, "overrides": {"data.init_args.n_train": int(t.split("=")[1])}} for t in ids]}))
        rows = []
        for t in ran + deleted:
            (sweep / t).mkdir()
            (sweep / t / "trial_result.json").write_text(json.dumps({"trial_id": t, "status": "ok", "epochs": 1}))
            rows.append({"trial_id": t, "status": "ok"})
        rows += [{"trial_id": t, "status": "pending"} for t in never]
        (sweep / "sweep_results.json").write_text(json.dumps(rows))
        for t in deleted:
            shutil.rmtree(sweep / t)
    setup.describe = (f"runs/{name}/: a sweep whose trials {ran} ran, {deleted} ran and then had their "
                      f"files deleted, {never} never ran (sweep.json, earlier sweep_results.json)")
    return setup


def fit_then(edit: Callable[[Path], None], config: str = "tiny.yaml", describe: str = "") -> Callable[[Path], None]:
    """A finished 1-epoch run of ``config`` (made here, in the case directory), then ``edit``."""
    def setup(d: Path) -> None:
        env = case_env(d, d.parent / "_aux" / "fit_then")
        r = subprocess.run([PY, "-m", "lightning_pfd", "fit", "--config", config], cwd=d, env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError("fit_then: the earlier run failed: " + r.stderr[-1500:])
        shutil.rmtree(d / ".lpfd_cache", ignore_errors=True)
        edit(d)
    setup.describe = describe or f"a finished 1-epoch run of {config}, then changed"
    return setup


def copied_sweep(name: str) -> Callable[[Path], None]:
    """A sweep recorded (sweep.json with its trials' config fingerprints, every trial's result on
    disk) in another folder, then copied here: the folder of a sweep moved to another machine."""
    def setup(d: Path) -> None:
        from lightning_pfd.sweeps.runner import _sweep_record
        from lightning_pfd.sweeps.spec import expand_trials, load_sweep

        orig = d.parent / "_aux" / "copied_sweep_origin"
        shutil.rmtree(orig, ignore_errors=True)
        orig.mkdir(parents=True)
        write_sweep_file("sw.yaml", {"data.init_args.n_train": [16, 24]})(orig)
        cwd = os.getcwd()
        os.chdir(orig)
        try:
            spec = load_sweep(orig / "sw.yaml")
            trials = expand_trials(spec)
            spec.sweep_dir.mkdir(parents=True)
            (spec.sweep_dir / "sweep.json").write_text(json.dumps(_sweep_record(spec, trials, spec.resources),
                                                                  default=str))
            for t in trials:
                (spec.sweep_dir / t.trial_id).mkdir()
                (spec.sweep_dir / t.trial_id / "trial_result.json").write_text(
                    json.dumps({"trial_id": t.trial_id, "status": "ok", "epochs": 1}))
        finally:
            os.chdir(cwd)
        for p in orig.iterdir():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, d / p.name)
        shutil.rmtree(orig)
    setup.describe = f"runs/{name}/ of a finished 2-trial sweep recorded in another folder, copied here"
    return setup


def stop_holders() -> None:
    while HOLDERS:
        p = HOLDERS.pop()
        p.kill()
        p.wait()


def write_sweep_file(name: str, grid: dict, callbacks: Optional[list] = None) -> Callable[[Path], None]:
    """A sweep file over the tiny digits config (written next to it as ``sweep_base.yaml``)."""
    def setup(d: Path) -> None:
        (d / "sweep_base.yaml").write_text(_yaml_dump(tiny_config(callbacks=callbacks)))
        (d / name).write_text(_yaml_dump({"name": "sw", "base": "sweep_base.yaml", "root": "runs",
                                          "grid": grid}))
    setup.describe = f"{name}: a sweep of the tiny digits config over {grid}" + (
        f" + {[c[0] for c in callbacks]}" if callbacks else "")
    return setup


WORK = "work"  # every command-line case runs in ROOT/work (the same absolute path as the fixture
#               run was made in, like a user re-running in the run's directory), then is moved to
#               ROOT/cases/<id>


def build_fixture(root: Path, timeout: int) -> Path:
    """A finished tiny run (1 epoch): tiny.yaml, run/checkpoints/last.ckpt, run/csv/version_0.
    Made in ROOT/work, the directory every command-line case runs in, then moved aside."""
    fx = root / "fixture_earlier_run"
    work = root / WORK
    for p in (fx, work):
        if p.exists():
            shutil.rmtree(p)
    work.mkdir(parents=True)
    write_config()(work)
    env = case_env(work, root / "_aux" / "fixture")
    t0 = time.time()
    r = subprocess.run([PY, "-m", "lightning_pfd", "fit", "--config", "tiny.yaml"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not (work / "run" / "checkpoints" / "last.ckpt").is_file():
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit("could not build the fixture run")
    shutil.rmtree(work / ".lpfd_cache", ignore_errors=True)
    work.rename(fx)
    print(f"fixture: finished tiny run in {time.time() - t0:.1f} s ({fx})", flush=True)
    return fx


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    area: str
    what: str
    argv: Optional[List[str]] = None        # python -m lightning_pfd <argv>
    code: Optional[str] = None              # Python API: python -c (wrapped)
    setup: List[Callable[[Path], None]] = field(default_factory=list)
    expect: str = "error"                   # error | ok | partial | debug
    must: List[str] = field(default_factory=list)   # substrings the message must contain
    hint: bool = False                      # a "did you mean" is expected (close name)
    earlier: bool = False                   # the directory holds a finished earlier run
    may_change_earlier: bool = False        # e.g. a resume continues the earlier run
    timeout: int = 150
    note: str = ""
    fsize_limit: Optional[int] = None       # RLIMIT_FSIZE of the subprocess (a full disk), bytes
    env: dict = field(default_factory=dict)  # extra environment ({dir}: the case's directory)
    must_not: List[str] = field(default_factory=list)   # substrings the message must not contain
    forbid: List[str] = field(default_factory=list)     # globs of files the case must not create
    status: Optional[int] = None            # expect="partial": the exact exit status wanted
    may_change: List[str] = field(default_factory=list)  # files an "earlier" case may rewrite
    signal_when: Optional[str] = None       # SIGTERM the subprocess once this file exists
    ro_mount: Optional[str] = None          # run with this folder of the case read-only (a bind mount
    #                                         in a private mount namespace: `unshare -rm`)

    def command(self) -> str:
        if self.argv is not None:
            return "python -m lightning_pfd " + shlex.join(self.argv)
        return "python: " + "; ".join(self.code.strip().splitlines())


def cases(fx: Path) -> List[Case]:
    E = copy_fixture(fx)
    R = str(REPRESENTATION)
    fit = ["fit", "--config", "tiny.yaml"]
    C: List[Case] = []
    add = C.append

    # ---- CLI --------------------------------------------------------------------------------
    add(Case("cli-01", "CLI", "typo in an option name", fit + ["--trainer.max_epoch", "2"],
             setup=[write_config()], must=["max_epoch"], hint=True))
    add(Case("cli-02", "CLI", "abbreviated option (--trainer.max_ep for max_epochs)",
             fit + ["--trainer.max_ep", "2"], setup=[write_config()], must=["max_ep", "max_epochs"],
             note="the hint should name the option the abbreviation stands for"))
    add(Case("cli-03", "CLI", "negative learning rate as typed (quickstart)",
             ["fit", "--config", "quickstart", "--model.init_args.lr", "-1e-3"], must=["lr", "-1e-3"]))
    add(Case("cli-06", "CLI", "max_epochs as a word", fit + ["--trainer.max_epochs", "two"],
             setup=[write_config()], must=["max_epochs", "two"]))
    add(Case("cli-08", "CLI", "missing config file", ["fit", "--config", "my_config.yaml"],
             must=["--config", "my_config.yaml"]))
    add(Case("cli-09", "CLI", "misspelt embedded config name", ["fit", "--config", "quikstart"],
             must=["quikstart"], hint=True))
    add(Case("cli-10", "CLI", "config file with broken YAML", ["fit", "--config", "broken.yaml"],
             setup=[write_text("broken.yaml", "trainer:\n  max_epochs: 1\n model: [unclosed\n")],
             must=["broken.yaml"]))
    add(Case("cli-11", "CLI", "callback stack (a YAML list) given as --config",
             ["fit", "--config", R], must=["representation.yaml"]))
    add(Case("cli-12", "CLI", "unknown key in the config file (learning_rate)", fit,
             setup=[write_config(overrides={"model.init_args.learning_rate": 1e-3})],
             must=["learning_rate"]))
    add(Case("cli-13", "CLI", "misspelt model class_path",
             fit + ["--model", "lightning_pfd.modules.DifusionModule"], setup=[write_config()],
             must=["DifusionModule"], hint=True))
    add(Case("cli-15", "CLI", "unknown net class_path in the config file", fit,
             setup=[write_config(net={"class_path": "lightning_pfd.nets.MLP",
                                      "init_args": {"dim": 64}})],
             must=["lightning_pfd.nets.MLP"], hint=True))
    add(Case("cli-16", "CLI", "unknown subcommand (train)", ["train", "--config", "tiny.yaml"],
             setup=[write_config()], must=["train"]))
    add(Case("cli-18", "CLI", "accelerator gpu on a CPU-only machine",
             fit + ["--trainer.accelerator", "gpu"], setup=[write_config()], must=["accelerator"]))
    add(Case("cli-20", "CLI", "negative limit_train_batches",
             fit + ["--trainer.limit_train_batches", "-1"], setup=[write_config()],
             must=["limit_train_batches"]))
    add(Case("cli-20", "CLI", "trainer.devices 0", fit + ["--trainer.devices", "0"],
             setup=[write_config()], must=["devices"]))
    add(Case("cli-21", "CLI", "missing callback stack file appended",
             fit + ["--trainer.callbacks+=callbacks/my_stack.yaml"], setup=[write_config()],
             must=["my_stack.yaml"]))
    add(Case("cli-23", "CLI", "--debug on a bad value shows the traceback (wanted)",
             fit + ["--model.init_args.lr", "0", "--debug"], setup=[write_config()], expect="debug"))
    add(Case("cli-24", "CLI", "valid tiny run (control)", fit, setup=[write_config()], expect="ok"))
    add(Case("cli-25", "CLI", "fresh fit into the directory of a finished run (no --overwrite)",
             fit, setup=[E], earlier=True, must=["ckpt"]))

    # ---- model --------------------------------------------------------------------------------
    def m(i, what, args, must, hint=False, cfg=None, expect="error", note=""):
        add(Case(f"model-{i:02d}", "model", what, fit + args, setup=[cfg or write_config()],
                 must=must, hint=hint, expect=expect, note=note))

    m(1, "lr 0", ["--model.init_args.lr", "0"], ["lr"])
    m(2, "family misspelt (edn)", ["--model.init_args.family", "edn"], ["family", "edn"], hint=True)
    m(3, "sampler misspelt (heunn)", ["--model.init_args.sampler", "heunn"], ["sampler", "heunn"],
      hint=True)
    m(4, "num_steps 0", ["--model.init_args.num_steps", "0"], ["num_steps"])
    m(5, "sigma_min > sigma_max", ["--model.init_args.sigma_min", "100"], ["sigma_min"])
    m(7, "ema_decay > 1", ["--model.init_args.ema_decay", "1.5"], ["ema_decay"])
    m(11, "on_divergence unknown (halt)", ["--model.init_args.on_divergence", "halt"],
      ["on_divergence", "halt"])
    m(13, "Adam betas outside [0, 1)", ["--model.init_args.betas", "[1.5, 0.999]"], ["betas"])
    m(14, "negative weight_decay", ["--model.init_args.weight_decay", "-0.1"], ["weight_decay"])
    m(15, "net/data shape mismatch (MLP dim 32 on 64-d digits)",
      ["--model.init_args.net.init_args.dim", "32"], ["net", "64"])
    m(17, "UNet preset misspelt (unet-4)", [], ["preset", "unet-4"], hint=True,
      cfg=write_config(net={"class_path": "lightning_pfd.nets.UNet",
                            "init_args": {"preset": "unet-4", "img_resolution": 8, "in_channels": 1}}))
    m(18, "UNet resolution not a multiple of 2^(levels-1)", [], ["img_resolution"],
      cfg=write_config(overrides={"data.init_args.as_vector": False, "data.init_args.image_size": 16},
                       net={"class_path": "lightning_pfd.nets.UNet",
                            "init_args": {"img_resolution": 10, "in_channels": 1, "model_channels": 8,
                                          "channel_mult": [1, 2, 2], "num_blocks": 1,
                                          "attn_resolutions": []}}))
    add(Case("model-22", "model", "LevyItoModule Adam betas outside [0, 1) (lim_precip)",
             ["fit", "--config", "lim_precip", "--model.init_args.betas", "[0.9, 1.0]"],
             must=["betas"]))
    add(Case("model-23", "model", "LevyItoModule alpha 2.5 (lim_precip)",
             ["fit", "--config", "lim_precip", "--model.init_args.alpha", "2.5"], must=["alpha"]))

    # ---- data ---------------------------------------------------------------------------------
    def dcase(i, what, argv, must, setup=None, hint=False, expect="error", earlier=False, note=""):
        add(Case(f"data-{i:02d}", "data", what, argv,
                 setup=setup if setup is not None else [write_config()], must=must,
                 hint=hint, expect=expect, earlier=earlier, note=note))

    tf = lambda path, **kw: {"class_path": "lightning_pfd.data.TensorFileDataModule",  # noqa: E731
                             "init_args": {"path": path, "batch_size": 32, **kw}}
    dcase(1, "n_train 0", fit + ["--data.init_args.n_train", "0"], ["n_train"])
    dcase(2, "n_train larger than the training split", fit + ["--data.init_args.n_train", "5000"],
          ["n_train", "5000"])
    dcase(3, "batch_size 0", fit + ["--data.init_args.batch_size", "0"], ["batch_size"])
    dcase(5, "unknown teacher name (quickstart, gmm_digit)",
          ["fit", "--config", "quickstart", "--data.init_args.teacher", "gmm_digit"],
          ["teacher", "gmm_digit"], setup=[], hint=True)
    dcase(6, "distillation config without its teacher checkpoint (distill_vp_digits as is)",
          ["fit", "--config", "distill_vp_digits"], ["teacher_ckpt"], setup=[])
    dcase(7, "CIFAR-10 root missing (data/cifar10, as in edm_cifar10)",
          fit + ["--data", "lightning_pfd.data.CIFAR10DataModule", "--data.init_args.root",
                 "data/cifar10"], ["root", "data_batch"])
    dcase(9, "tensor file with NaN values", fit, ["train_data", "NaN"],
          setup=[tensor_npz("data.npz", "nan"), write_config(data=tf("data.npz"))])
    dcase(10, "tensor file with float pixels in [0, 255]", fit, ["train_data", "255"],
          setup=[tensor_npz("data.npz", "255"), write_config(data=tf("data.npz"))])
    dcase(11, "tensor file path missing", fit, ["path", "missing.npz"],
          setup=[write_config(data=tf("missing.npz"))])
    dcase(12, "tensor file of an unsupported type (.csv)", fit, ["path", ".csv"],
          setup=[write_text("data.csv", "0.1,0.2\n0.3,0.4\n"), write_config(data=tf("data.csv"))])
    dcase(13, "tensor file without a known array key", fit, ["path", "images"],
          setup=[tensor_npz("data.npz", "badkey"), write_config(data=tf("data.npz"))])
    dcase(16, "tensor file holding int64 values", fit, ["train_data", "int64"],
          setup=[tensor_npz("data.npz", "int64"), write_config(data=tf("data.npz"))])
    dcase(17, "a .pt 'tensor file' that is really text", fit, ["path", "data.pt"],
          setup=[write_text("data.pt", "x,y\n1,2\n"), write_config(data=tf("data.pt"))])
    dcase(18, "tensor file, valid (control)", fit, [], expect="ok",
          setup=[tensor_npz("data.npz", "ok"), write_config(data=tf("data.npz"))])
    dcase(21, "NaN tensor file with --overwrite in the directory of a finished run",
          fit + ["--overwrite"], ["train_data", "NaN"], earlier=True,
          setup=[E, tensor_npz("data.npz", "nan"), write_config(data=tf("data.npz"))])

    # ---- callbacks ----------------------------------------------------------------------------
    def k(i, what, cbs, must, hint=False, argv=None, setup=None, expect="error", note=""):
        add(Case(f"cb-{i:02d}", "callbacks", what, argv or fit,
                 setup=setup if setup is not None else [write_config(callbacks=cbs)], must=must,
                 hint=hint, expect=expect,
                 note=note))

    k(1, "ICRMonitor unknown tap (block9)", [("ICRMonitor", dict(ICR_OK, tap="block9"))],
      ["tap", "block9"], hint=True)
    k(2, "ICRMonitor image_shape does not match the 64-d samples",
      [("ICRMonitor", dict(ICR_OK, image_shape=[1, 4, 4]))], ["image_shape"])
    k(3, "ICRMonitor num_images larger than the training set",
      [("ICRMonitor", dict(ICR_OK, num_images=5000))], ["num_images", "5000"])
    k(5, "ICRMonitor sigma 500 outside a VP denoiser's range [0.001, 152]",
      [("ICRMonitor", dict(ICR_OK, sigma=500.0))], ["sigma", "500"],
      argv=fit + ["--model.init_args.family", "vp"],
      setup=[write_config(callbacks=[("ICRMonitor", dict(ICR_OK, sigma=500.0))])])
    k(7, "ICRMonitor with a LevyItoModule config (lim_precip)", None, ["LevyItoModule"],
      argv=["fit", "--config", "lim_precip", "--trainer.callbacks+=lightning_pfd.callbacks.ICRMonitor"],
      setup=[])
    k(8, "GeneralizationMonitor num_eval 0", [("GeneralizationMonitor", {"num_eval": 0})], ["num_eval"])
    k(10, "GeneralizationMonitor num_eval > the datamodule's n_gen (quickstart)", None,
      ["num_eval", "n_gen"],
      argv=["fit", "--config", "quickstart", "--data.init_args.n_gen", "100"], setup=[])
    k(11, "TailMonitor num_samples larger than the reference (lim_precip)", None, ["num_samples"],
      argv=["fit", "--config", "lim_precip", "--trainer.callbacks+=lightning_pfd.callbacks.TailMonitor",
            "--trainer.callbacks.init_args.num_samples", "100000",
            "--trainer.callbacks.init_args.name", "tail2"], setup=[])
    k(12, "TailMonitor observable misspelt (maxx)", [("TailMonitor", {"observable": "maxx"})],
      ["observable", "maxx"], hint=True)
    k(14, "MemorizationMonitor unknown criterion (nn-ratio)",
      [("MemorizationMonitor", {"criterion": "nn-ratio"})], ["criterion", "nn-ratio"], hint=True)
    k(16, "two stacks composed: quickstart + representation.yaml (README example)", None,
      ["name"], argv=["fit", "--config", "quickstart", f"--trainer.callbacks+={R}"], setup=[])
    k(17, "the same stack appended twice", None, ["name"],
      argv=fit + [f"--trainer.callbacks+={R}", f"--trainer.callbacks+={R}"], setup=[write_config()])
    k(18, "ICREarlyStopping monitoring a key no ICRMonitor logs",
      [("ICRMonitor", ICR_OK), ("ICREarlyStopping", {"monitor": "icr/ICR"})], ["monitor", "icr/ICR"],
      hint=True)
    k(21, "ICRMonitor on the 64-d digits, valid (control)", [("ICRMonitor", ICR_OK)], [], expect="ok")

    # ---- checkpoints --------------------------------------------------------------------------
    def p(i, what, argv, must, setup=None, earlier=True, expect="error", may=False, hint=False,
          note=""):
        add(Case(f"ckpt-{i:02d}", "checkpoints", what, argv, setup=[E] + (setup or []) if earlier
                 else (setup or []), must=must, earlier=earlier, expect=expect,
                 may_change_earlier=may, hint=hint, note=note))

    p(1, "--ckpt_path to a missing file", fit + ["--ckpt_path", "run/checkpoints/lst.ckpt"],
      ["lst.ckpt", "no such file"])
    p(2, "--ckpt_path to a zero-byte file", fit + ["--ckpt_path", "empty.ckpt"], ["empty.ckpt", "empty"],
      setup=[ckpt_variant("empty.ckpt", "empty", fx)])
    p(3, "--ckpt_path to a truncated file", fit + ["--ckpt_path", "half.ckpt"], ["half.ckpt"],
      setup=[ckpt_variant("half.ckpt", "truncated", fx)])
    p(4, "--ckpt_path to a text file", fit + ["--ckpt_path", "notes.ckpt"], ["notes.ckpt", "text"],
      setup=[ckpt_variant("notes.ckpt", "text", fx)])
    p(5, "--ckpt_path to a file with flipped bytes", fit + ["--ckpt_path", "flipped.ckpt"],
      ["flipped.ckpt"], setup=[ckpt_variant("flipped.ckpt", "flipped", fx)])
    p(8, "--ckpt_path last in an empty directory", fit + ["--ckpt_path", "last"], ["last"],
      setup=[write_config()], earlier=False)
    p(10, "resume with a changed architecture (hidden 64)",
      fit + ["--ckpt_path", "last", "--model.init_args.net.init_args.hidden", "64",
             "--trainer.max_epochs", "2"], ["hidden"])
    p(12, "resume with a changed lr (allowed: applied and printed)",
      fit + ["--ckpt_path", "last", "--model.init_args.lr", "5e-4", "--trainer.max_epochs", "2"], [],
      expect="ok", may=True)
    p(13, "resume with invalid Adam betas",
      fit + ["--ckpt_path", "last", "--model.init_args.betas", "[1.5, 0.999]",
             "--trainer.max_epochs", "2"], ["betas"])
    p(14, "--overwrite fresh fit with a negative weight_decay in a finished run's directory",
      fit + ["--overwrite", "--model.init_args.weight_decay", "-0.1"], ["weight_decay"])
    p(16, "resume with an ICRMonitor tap typo (earlier run's CSV must stay intact)",
      ["fit", "--config", "tiny_icr.yaml", "--ckpt_path", "last", "--trainer.max_epochs", "2"],
      ["tap"], setup=[write_config("tiny_icr.yaml", callbacks=[("ICRMonitor", dict(ICR_OK, tap="midle"))])],
      hint=True)

    # ---- commands: report ---------------------------------------------------------------------
    def r(i, what, argv, must, setup=None, expect="error", earlier=False, hint=False, note=""):
        add(Case(f"report-{i:02d}", "report", what, ["report"] + argv, setup=setup or [], must=must,
                 expect=expect, earlier=earlier, hint=hint, note=note))

    r(1, "report on a missing directory", ["runs/nope"], ["runs/nope"])
    r(2, "report on an empty directory", ["empty"], ["empty"], setup=[make_dir("empty")])
    r(3, "report on a truncated log (killed run)", ["run/csv"], ["cut"], expect="partial",
      setup=[truncate_log(fx)], earlier=True)
    r(4, "report on a checkpoint file instead of a log", ["run/checkpoints/last.ckpt"], ["last.ckpt"],
      setup=[E], earlier=True)
    r(5, "report --window 0", ["run/csv", "--window", "0"], ["window"], setup=[E], earlier=True)
    r(6, "report --segment 7 (no such segment)", ["run/csv", "--segment", "7"], ["segment"],
      setup=[E], earlier=True)
    r(7, "report --out naming an existing file", ["run/csv", "--out", "tiny.yaml"], ["--out"],
      setup=[E], earlier=True)
    r(8, "report on a finished run (control)", ["run/csv"], [], expect="ok", setup=[E], earlier=True)

    # ---- commands: icr-sweep ------------------------------------------------------------------
    ck = ["--ckpt", "run/checkpoints/last.ckpt"]
    dig = ["--data", "digits", "--data-args", '{"as_vector": true}']

    def s(i, what, argv, must, hint=False, expect="error", earlier=True, note=""):
        add(Case(f"sweep-{i:02d}", "icr-sweep", what, ["icr-sweep"] + argv,
                 setup=[E] if earlier else [], must=must, hint=hint, expect=expect, earlier=earlier,
                 note=note))

    s(1, "--ckpt to a missing file", ["--ckpt", "nope.ckpt", "--data", "digits"], ["--ckpt", "nope.ckpt"],
      earlier=False)
    s(2, "--sigmas with a negative level", ck + dig + ["--sigmas", "-1", "0.5"], ["--sigmas"])
    s(3, "--sigmas not a number", ck + dig + ["--sigmas", "abc"], ["--sigmas", "abc"])
    s(5, "--tap unknown (after loading)", ck + dig + ["--tap", "block9", "--num-images", "64"],
      ["--tap", "block9"], hint=True)
    s(6, "--data misspelt (digitz)", ck + ["--data", "digitz"], ["--data", "digitz"], hint=True)
    s(8, "--num-images larger than the training set", ck + dig + ["--num-images", "5000"],
      ["--num-images", "5000"])
    s(9, "--level 9", ck + dig + ["--level", "9"], ["--level", "9"])
    s(10, "--ckpt to a text file", ["--ckpt", "tiny.yaml"] + dig, ["--ckpt"])
    s(11, "--data-args malformed", ck + ["--data", "digits", "--data-args", '{"as_vector": tru'],
      ["--data-args"])
    s(12, "--data missing", ck, ["--data"])
    s(13, "valid sweep (control)", ck + dig + ["--sigmas", "0.1", "0.5", "--num-images", "64",
                                               "--out", "sweep"], [], expect="ok")

    # ---- newcomer papercuts (issue 30): one run folder, icr-sweep output, a run still training ----
    def n(i, what, argv, must, setup=None, expect="error", earlier=False, **kw):
        add(Case(f"newcomer-{i:02d}", "newcomer", what, argv, setup=setup or [], must=must,
                 expect=expect, earlier=earlier, **kw))

    n(1, "fit --run_dir '' (an empty path)", fit + ["--run_dir", ""], ["--run_dir"], setup=[write_config()])
    n(2, "fit --run_dir through a regular file (afile/run2)", fit + ["--run_dir", "afile/run2"],
      ["afile", "regular file"], setup=[write_config(), write_text("afile", "not a directory\n")])
    n(3, "fit --run_dir naming a finished run's folder (no --overwrite)", fit + ["--run_dir", "run"],
      ["earlier run", "--ckpt_path last"], setup=[E], earlier=True)
    n(4, "fit --run_dir runs/other next to a finished run (allowed: every output moves there)",
      fit + ["--run_dir", "runs/other"], ["runs/other"], expect="ok", setup=[E], earlier=True,
      forbid=["run/*"], timeout=300, note="config, CSV log, checkpoints in runs/other; the earlier run untouched")
    n(5, "icr-sweep --out through a regular file", ["icr-sweep"] + ck + dig + ["--out", "tiny.yaml/sw"],
      ["--out", "tiny.yaml"], setup=[E], earlier=True)
    n(6, "icr-sweep without --out on a two-level grid (allowed: beside the run, edge minimum flagged)",
      ["icr-sweep"] + ck + dig + ["--sigmas", "0.1", "0.5", "--num-images", "64", "--probe-train", "256"],
      ["at the grid's", "run/icr_sweep/last", "±"], expect="ok", setup=[E], earlier=True, timeout=300,
      forbid=["icr_sweep*"], note="written to run/icr_sweep/last/, not the current folder")
    n(7, "report on a run still training (W&B log not flushed, CSV rows, the run lock held)",
      ["report", "run"], ["still training", "read the CSV log instead"], expect="ok", earlier=True,
      setup=[E, make_dir("run/wandb/offline-run-20250101_000000-live1"),
             write_bytes("run/wandb/offline-run-20250101_000000-live1/run-live1.wandb", b""),
             hold_lock("run/checkpoints")],
      note="reads the CSV rows so far; says the run is in progress (stderr and report.md)")

    # ---- issue 40, second round: sample counts beyond memory, a full report disk -----------------
    n(8, "GeneralizationMonitor num_eval 10^10 (more seeds than memory)", fit,
      ["num_eval", "GiB of memory"], setup=[write_config(callbacks=[("GeneralizationMonitor", {"num_eval": 10 ** 10})])])
    n(9, "MemorizationMonitor num_samples 10^10", fit, ["num_samples", "GiB of memory"],
      setup=[write_config(callbacks=[("MemorizationMonitor", {"num_samples": 10 ** 10})])])
    n(10, "report --out on a full disk (ulimit -f 1 kB)", ["report", "run", "--out", "rep"],
      ["rep", "cannot be written", "--out"], setup=[E], earlier=True, fsize_limit=1024,
      note="names the output file, not the input run; the run's files unchanged")

    # ---- commands: pite -----------------------------------------------------------------------
    def t(i, what, argv, must, setup=None, hint=False, earlier=False, note=""):
        add(Case(f"pite-{i:02d}", "pite", what, ["pite", "--out", "pite_out"] + argv, setup=setup or [],
                 must=must, hint=hint, earlier=earlier, note=note))

    t(1, "--max-steps 0", ["--max-steps", "0"], ["--max-steps"])
    t(2, "--eta 1.5", ["--eta", "1.5"], ["--eta"])
    t(3, "--sbm-families misspelt (edn)", ["--sbm-families", "edn"], ["--sbm-families", "edn"],
      hint=True)
    t(4, "--num-samples >= --n-train", ["--num-samples", "4096"], ["--num-samples"])
    t(5, "--lim-config missing file", ["--lim-config", "my_lim.yaml"], ["--lim-config", "my_lim.yaml"])
    t(6, "--lim-sampler unknown (euler)", ["--lim-sampler", "euler"], ["--lim-sampler", "euler"])
    t(7, "--override with a negative lr", ["--override=--model.init_args.lr=-1"], ["lr"])
    t(8, "--observable misspelt (maxx)", ["--observable", "maxx"], ["maxx"], hint=True)
    t(9, "--crop-size 10 (not a U-Net resolution)", ["--crop-size", "10"], ["10"])
    t(10, "--out holding an earlier run's results", [], ["--out"], setup=[pite_results("pite_out")],
      earlier=True)
    t(11, "--threads -1", ["--threads", "-1"], ["--threads"])
    t(12, "--max-steps not a number", ["--max-steps", "1k"], ["--max-steps", "1k"])

    # ---- faults: signals, locks, disk, paths, sweeps (issue 22) --------------------------------
    def f(i, what, argv, must, setup=None, expect="error", earlier=False, may=False, note="", **kw):
        add(Case(f"fault-{i:02d}", "faults", what, argv, setup=setup or [], must=must, expect=expect,
                 earlier=earlier, may_change_earlier=may, note=note, **kw))

    f(1, "SIGTERM (a scheduler) during a fit, after its first checkpoint", fit + [
        "--trainer.max_epochs", "1000"], ["SIGTERM", "143", "--ckpt_path last"], expect="signal",
      setup=[write_config()], signal_when="run/checkpoints/last.ckpt", timeout=240,
      note="exit 143 with the resumable checkpoint and the resume command")
    f(2, "a second fit into a run directory whose fit is still running", fit,
      ["another process is writing this run", "pid"], setup=[write_config(), hold_lock("run/checkpoints")])
    f(3, "a fit into a run directory with the stale lock of a killed fit (allowed: taken over)", fit,
      [], expect="ok", setup=[write_config(), stale_lock("run/checkpoints")],
      note="one line 'taking over the stale lock of pid ...'")
    f(4, "disk full (ulimit -f 300 kB) while a resumed run writes its checkpoint",
      fit + ["--ckpt_path", "last", "--trainer.max_epochs", "2", "--model.init_args.lr", "2e-3"],
      ["cannot write", "last.ckpt", "file-size limit", "intact"], expect="env", setup=[E], earlier=True,
      may=True, fsize_limit=300 * 1024,
      note="last.ckpt and config.yaml unchanged; Lightning's CSVLogger rewrites hparams.yaml (the new "
           "lr) and appends the failed epoch's rows to metrics.csv (a resume drops rows after its "
           "checkpoint)")
    f(5, "output path through a regular file (default_root_dir afile/run)",
      fit + ["--trainer.default_root_dir", "afile/run"], ["default_root_dir", "afile", "regular file"],
      setup=[write_config(), write_text("afile", "not a directory\n")])
    f(6, "checkpoint dirpath through a regular file",
      fit + ["--trainer.callbacks.dirpath", "afile/ckpt"], ["dirpath", "afile", "regular file"],
      setup=[write_config(), write_text("afile", "not a directory\n")])
    f(7, "sweep --address 127.0.0.1:1 (nothing listens)",
      ["sweep", "--config", "sw.yaml", "--address", "127.0.0.1:1"], ["--address", "127.0.0.1:1"],
      setup=[write_sweep_file("sw.yaml", {"data.init_args.n_train": [16, 32]})], timeout=60)
    f(8, "sweep with trials whose training set is smaller than ICRMonitor.num_images",
      ["sweep", "--config", "sw.yaml"], ["n_train=32", "n_train=48", "num_images"],
      setup=[write_sweep_file("sw.yaml", {"data.init_args.n_train": [32, 48, 128]},
                              callbacks=[("ICRMonitor", ICR_OK)])])
    f(9, "sweep with grid: {}", ["sweep", "--config", "sw.yaml"], ["grid", "empty"],
      setup=[write_sweep_file("sw.yaml", {})])
    f(10, "a second sweep driver with the same name", ["sweep", "--config", "sw.yaml"],
      ["another process is writing this sweep"],
      setup=[write_sweep_file("sw.yaml", {"data.init_args.n_train": [16, 32]}), hold_lock("runs/sw")])
    f(11, "icr-sweep of a vector model (the quickstart's MLP) with image data --data digits (allowed: "
          "flattened)", ["icr-sweep", "--ckpt", "run/checkpoints/last.ckpt", "--data", "digits",
                         "--sigmas", "0.29", "--num-images", "64", "--out", "icr"], [], expect="ok",
      setup=[E], earlier=True, note="a line says the images are flattened; a warning for n < 4d")
    # ---- the smaller faults of issue 22: a finished run's logs, monitored keys, W&B, sweeps, hints
    f(12, "validate --ckpt_path last on a finished run (allowed: its own logger version)",
      ["validate", "--config", "tiny.yaml", "--ckpt_path", "last"], ["new logger version"], expect="ok",
      setup=[E], earlier=True, note="the training run's metrics.csv, hparams.yaml and W&B run unchanged")
    f(13, "fit --ckpt_path last of a finished run (max_epochs already reached)",
      fit + ["--ckpt_path", "last"], ["already finished", "--trainer.max_epochs"], expect="ok", setup=[E],
      earlier=True, forbid=["*"], note="says so, exit 0, writes nothing (no duplicated metrics.csv row)")
    f(14, "plain Lightning ModelCheckpoint monitor typo (pfd/e_genn) resuming a finished run",
      ["fit", "--config", "typo.yaml", "--ckpt_path", "last", "--trainer.max_epochs", "2"],
      ["monitor", "pfd/e_genn"], hint=True, earlier=True, setup=[E, write_config("typo.yaml", callbacks=[
          ("GeneralizationMonitor", {"num_eval": 16, "num_loss_samples": 32}),
          ("lightning.pytorch.callbacks.ModelCheckpoint", {"monitor": "pfd/e_genn", "dirpath": "run/best"})])])
    f(15, "plain Lightning EarlyStopping monitor typo (icr/icrr)", fit, ["monitor", "icr/icrr"], hint=True,
      setup=[write_config(callbacks=[("ICRMonitor", ICR_OK),
                                     ("lightning.pytorch.callbacks.EarlyStopping", {"monitor": "icr/icrr"})])])
    f(16, "WANDB_MODE=online without W&B credentials (no WANDB_API_KEY, no netrc)", fit,
      ["WANDB_MODE", "wandb login"], env={"WANDB_MODE": "online", "HOME": "{aux}/home", "NETRC": "{aux}/no_netrc"},
      setup=[write_config(overrides={"trainer.logger": [
          TINY["trainer"]["logger"], {"class_path": "lightning_pfd.callbacks.AutoWandbLogger",
                                      "init_args": {"save_dir": "run", "project": "battery"}}]})])
    f(17, "sweep --aggregate-only after a finished trial's files were deleted",
      ["sweep", "--config", "sw.yaml", "--aggregate-only"], ["missing", "n_train=24", "pending", "n_train=32"],
      expect="partial", status=1, earlier=True,
      may_change=["runs/sw/sweep_results.json"], setup=[finished_sweep("sw", ["n_train=16"], ["n_train=24"],
                                                                       ["n_train=32"])],
      note="the deleted trial is 'missing' (not 'pending'), exit 1; the results files are rewritten")
    f(18, "LIGHTNING_PFD_CACHE pointing to a regular file (quickstart)",
      ["fit", "--config", "quickstart", "--trainer.max_epochs", "1"], ["LIGHTNING_PFD_CACHE"],
      env={"LIGHTNING_PFD_CACHE": "{dir}/afile"}, must_not=["data.init_args"],
      setup=[write_text("afile", "not a directory\n")])
    f(19, "an option given twice, the first value bad (C05: --trainer.max_epochs two, then 3)",
      fit + ["--trainer.max_epochs", "two", "--trainer.max_epochs", "3"], ["max_epochs", "'two'"],
      must_not=["was '3'"], setup=[write_config()])
    f(20, "an option given twice, the last value refused by the Trainer (max_epochs 3, then -2)",
      fit + ["--trainer.max_epochs", "3", "--trainer.max_epochs", "-2"], ["max_epochs", "-2"],
      must_not=["max_epochs, trainer.max_epochs", "max_epochs 3"], setup=[write_config()])
    f(21, "an appended checkpoint stack without dirpath (as configs/callbacks/representation.yaml)",
      fit + ["--trainer.callbacks+=stack.yaml"], ["writes to"], expect="ok", forbid=["run/csv/*/checkpoints/*"],
      setup=[write_config(), write_text("stack.yaml", "- class_path: lightning_pfd.callbacks.EpochCheckpoint\n"
                                        "  init_args: {monitor: val/loss, filename: best-val}\n")],
      note="one checkpoint folder per run (run/checkpoints), not a second one in the logger's version")
    f(22, "a 1-sample training set with an ICRMonitor", fit, ["training samples", "1"],
      setup=[write_config(callbacks=[("ICRMonitor", ICR_OK)], overrides={"data.init_args.n_train": 1})],
      note="the data size is named as the problem")

    # ---- issue 30: wrong results or lost work, and the errors that came late --------------------
    def w(i, what, argv, must, setup=None, expect="error", earlier=False, may=False, note="", **kw):
        add(Case(f"work-{i:02d}", "lost work", what, argv, setup=setup or [], must=must, expect=expect,
                 earlier=earlier, may_change_earlier=may, note=note, **kw))

    plain_last = {"trainer.callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                         "init_args": {"dirpath": "run/checkpoints", "save_last": True,
                                                       "save_top_k": 0}}]}
    qs_sweep = lambda grid: write_text("qs.yaml", _yaml_dump({  # noqa: E731
        "name": "qs", "base": "quickstart", "root": "runs", "grid": grid,
        "shared": {"trainer.max_epochs": 1, "data.init_args.samples_per_epoch": 128}}))
    w(1, "fit --overwrite into the directory of a finished run", fit + ["--overwrite"], ["--overwrite", "moved to"],
      expect="ok", setup=[E], earlier=True, may=True, forbid=["run/checkpoints/last-v*.ckpt"],
      note="the earlier checkpoints move to run/checkpoints/overwritten-<time>/; last.ckpt is the new run's")
    w(2, "SIGTERM after the first epoch with a plain ModelCheckpoint(save_last=True, save_top_k=0)",
      fit + ["--trainer.max_epochs", "1000"], ["SIGTERM", "143", "end of epoch", "--ckpt_path last"],
      expect="signal", setup=[write_config(overrides=plain_last)], signal_when="run/checkpoints/last.ckpt",
      must_not=["did not finish"], timeout=240,
      note="an EpochCheckpoint takes its place: last.ckpt at every epoch end")
    w(3, "resume with a changed data value (--data.init_args.n_train 128)",
      fit + ["--ckpt_path", "last", "--trainer.max_epochs", "2", "--data.init_args.n_train", "128"],
      ["data", "n_train", "--allow-data-change"], setup=[E], earlier=True)
    w(4, "resume after the data file was replaced (TensorFileDataModule, one value changed)",
      ["fit", "--config", "tf.yaml", "--ckpt_path", "last", "--trainer.max_epochs", "2"],
      ["data.init_args.path", "data.npz", "content changed"],
      setup=[tensor_npz("data.npz", "ok"), write_config("tf.yaml", data={
          "class_path": "lightning_pfd.data.TensorFileDataModule",
          "init_args": {"path": "data.npz", "batch_size": 32}}),
          fit_then(tensor_npz("data.npz", "ok2"), "tf.yaml", "a finished run of tf.yaml; then data.npz "
                   "rewritten with other values")], timeout=300)
    w(5, "a max_steps stop inside an epoch (resume of the earlier run with max_steps 3)",
      fit + ["--ckpt_path", "last", "--trainer.max_epochs", "3", "--trainer.max_steps", "3"],
      ["stopped inside epoch 1", "from its start"], expect="ok", setup=[E], earlier=True, may=True,
      note="last.ckpt stays at the end of epoch 0 (unchanged); a resume re-runs epoch 1 whole")
    w(6, "sweep --resume after a finished trial's folder was deleted",
      ["sweep", "--config", "sw.yaml", "--resume"], ["sweep finished: 3 ok"], expect="ok",
      setup=[finished_sweep("sw", ["n_train=16"], ["n_train=24"], ["n_train=32"])], earlier=True, may=True,
      timeout=420, note="the deleted trial and the never-run one are trained; the finished one is not")
    w(7, "sweep --resume of a sweep folder copied from elsewhere (nothing edited)",
      ["sweep", "--config", "sw.yaml", "--resume"], ["0 of 2 trials to run"], expect="ok",
      setup=[copied_sweep("sw")], earlier=True, may=True, must_not=["changed since the sweep started"],
      timeout=240)
    w(8, "sweep with base: quickstart (1 trial, 1 short epoch)", ["sweep", "--config", "qs.yaml"],
      ["1 ok"], expect="ok", setup=[qs_sweep({"data.init_args.n_train": [64]})], timeout=500,
      note="the quickstart's PFDProgressBar passes the pre-flight")
    w(9, "sweep --dry-run with base: quickstart and a trial fit refuses (num_images 64 > n_train 32)",
      ["sweep", "--config", "qs.yaml", "--dry-run"], ["n_train=32", "num_images"],
      setup=[qs_sweep({"data.init_args.n_train": [32, 64]})], timeout=240)
    w(10, "a read-only run directory (resume of the earlier run)",
      fit + ["--ckpt_path", "last", "--trainer.max_epochs", "2"], ["read-only"], setup=[E], earlier=True,
      ro_mount=".", note="a read-only bind mount of the case directory (unshare -rm)")
    w(11, "LIGHTNING_PFD_CACHE on a read-only file system", fit, ["LIGHTNING_PFD_CACHE"],
      setup=[write_config(), make_dir("rocache")], env={"LIGHTNING_PFD_CACHE": "{dir}/rocache/sub"},
      ro_mount="rocache")
    w(12, "a 300-character path component in default_root_dir",
      fit + ["--trainer.default_root_dir", "run/" + "a" * 300], ["default_root_dir", "longer than"],
      setup=[write_config()])
    w(13, "--trainer.max_epochs 0", fit + ["--trainer.max_epochs", "0"], ["max_epochs", "trains nothing"],
      setup=[write_config()])
    w(14, "a key given twice in the config file", ["fit", "--config", "dup.yaml"],
      ["max_epochs", "twice", "dup.yaml"],
      setup=[write_text("dup.yaml", _yaml_dump(TINY).replace("  max_epochs: 1\n", "  max_epochs: 1\n  max_epochs: 3\n"))])
    w(15, "the old option --model.init_args.precond", fit + ["--model.init_args.precond", "edm"],
      ["precond", "family"], setup=[write_config()])
    w(16, "resume after a kill left .last.ckpt.*.tmp of a checkpoint write",
      fit + ["--ckpt_path", "last", "--trainer.max_epochs", "2"], ["removed 1 unfinished checkpoint write"],
      expect="ok", setup=[E, write_bytes("run/checkpoints/.last.ckpt.k2j4x_q1.tmp", b"PK\x03\x04 half")],
      earlier=True, may=True, note="the temporary file is removed under the run's lock")

    # ---- Python API ---------------------------------------------------------------------------
    def a(i, what, code, must, hint=False, note=""):
        add(Case(f"api-{i:02d}", "Python API", what, code=code, must=must, hint=hint, note=note))

    mlp = "from lightning_pfd.nets import MLPNet\nfrom lightning_pfd.modules import DiffusionModule\n"
    a(1, "DiffusionModule lr=-1", mlp + "DiffusionModule(MLPNet(64), lr=-1)", ["lr"])
    a(2, "DiffusionModule family='edn'", mlp + "DiffusionModule(MLPNet(64), family='edn')",
      ["family", "edn"], hint=True)
    a(3, "DiffusionModule sigma_min > sigma_max", mlp + "DiffusionModule(MLPNet(64), sigma_min=100.0)",
      ["sigma_min"])
    a(4, "DiffusionModule betas=(1.5, 0.999)", mlp + "DiffusionModule(MLPNet(64), betas=(1.5, 0.999))",
      ["betas"])
    a(5, "DiffusionModule weight_decay=-0.1", mlp + "DiffusionModule(MLPNet(64), weight_decay=-0.1)",
      ["weight_decay"])
    a(6, "DiffusionModule with a net lacking data_shape",
      "import torch\nfrom lightning_pfd.modules import DiffusionModule\n"
      "DiffusionModule(torch.nn.Linear(4, 4))", ["net"])
    a(7, "MLPNet dim=0", "from lightning_pfd.nets import MLPNet\nMLPNet(dim=0)", ["dim"])
    a(8, "UNet preset='unet-4' (typo)", "from lightning_pfd.nets import UNet\nUNet(preset='unet-4')",
      ["preset", "unet-4"], hint=True)
    a(9, "UNet img_resolution=10", "from lightning_pfd.nets import UNet\n"
      "UNet(img_resolution=10, in_channels=1, model_channels=8, channel_mult=[1, 2, 2])",
      ["img_resolution"])
    a(10, "LevyItoModule alpha=2.5", "from lightning_pfd.nets import MLPNet\n"
      "from lightning_pfd.modules import LevyItoModule\nLevyItoModule(MLPNet(64), alpha=2.5)", ["alpha"])
    a(10, "LevyItoModule weight_decay=-1", "from lightning_pfd.nets import MLPNet\n"
      "from lightning_pfd.modules import LevyItoModule\nLevyItoModule(MLPNet(64), weight_decay=-1.0)",
      ["weight_decay"])
    a(11, "DigitsDataModule n_train=0", "from lightning_pfd.data import DigitsDataModule\n"
      "DigitsDataModule(n_train=0)", ["n_train"])
    a(12, "DigitsDataModule n_train=5000, setup()", "from lightning_pfd.data import DigitsDataModule\n"
      "DigitsDataModule(n_train=5000).setup('fit')", ["n_train", "5000"])
    a(13, "TensorFileDataModule on a missing file",
      "from lightning_pfd.data import TensorFileDataModule\nTensorFileDataModule('missing.npz')",
      ["path", "missing.npz"])
    a(13, "TeacherDistillationDataModule with a missing teacher_ckpt",
      "from lightning_pfd.data import TeacherDistillationDataModule\n"
      "TeacherDistillationDataModule(teacher_ckpt='runs/teacher/last.ckpt')", ["teacher_ckpt"])
    a(14, "TeacherDistillationDataModule teacher='gmm_digit'",
      "from lightning_pfd.data import TeacherDistillationDataModule\n"
      "TeacherDistillationDataModule(teacher='gmm_digit')", ["teacher", "gmm_digit"], hint=True)
    a(15, "ICRMonitor level=9", "from lightning_pfd.callbacks import ICRMonitor\nICRMonitor(level=9)",
      ["level"])
    a(16, "GeneralizationMonitor num_eval=0",
      "from lightning_pfd.callbacks import GeneralizationMonitor\nGeneralizationMonitor(num_eval=0)",
      ["num_eval"])
    a(17, "MemorizationMonitor criterion='l2'",
      "from lightning_pfd.callbacks import MemorizationMonitor\nMemorizationMonitor(criterion='l2')",
      ["criterion", "l2"])
    a(18, "TailMonitor eta=2", "from lightning_pfd.callbacks import TailMonitor\nTailMonitor(eta=2)",
      ["eta"])
    a(19, "load_checkpoint on a missing file",
      "from lightning_pfd.checkpoint import load_checkpoint\nload_checkpoint('missing.ckpt')",
      ["missing.ckpt"])
    a(20, "karras_sigmas with sigma_min > sigma_max",
      "from lightning_pfd.diffusion import karras_sigmas\nkarras_sigmas(18, sigma_min=100.0, sigma_max=80.0)",
      ["sigma_min"])
    a(21, "TensorDataModule with NaN data, setup()",
      "import torch\nfrom lightning_pfd.data import TensorDataModule\n"
      "x = torch.zeros(10, 4); x[3, 1] = float('nan')\nTensorDataModule(train_data=x).setup('fit')",
      ["train_data", "NaN"])
    # this release's new arguments: event detectors, null families, the rise test, the collapse fit
    es = "from lightning_pfd.callbacks import ICREarlyStopping\n"
    a(22, "ICREarlyStopping min_rise_z=-1", es + "ICREarlyStopping(min_rise_z=-1)", ["min_rise_z", "-1"])
    a(22, "ICREarlyStopping rise_window=0", es + "ICREarlyStopping(rise_window=0)", ["rise_window"])
    a(22, "ICREarlyStopping horizon=0", es + "ICREarlyStopping(horizon=0)", ["horizon"])
    a(22, "detect_memorization_onset without a memorization signal",
      "import numpy as np\nfrom lightning_pfd.analysis import detect_memorization_onset\n"
      "detect_memorization_onset(np.arange(10.0), None)", ["mem_ratio"])
    a(22, "detect_early_learning min_sigma=nan", "import numpy as np\n"
      "from lightning_pfd.analysis import detect_early_learning\n"
      "detect_early_learning(np.arange(10.0), np.ones(10), min_sigma=float('nan'))", ["min_sigma"])
    a(22, "variogram short_lag=0", "import numpy as np\n"
      "from lightning_pfd.analysis.inference import Curve, variogram\n"
      "variogram(Curve(np.arange(20.0), np.ones(20)), short_lag=0)", ["short_lag"])
    cal = f"import sys\nsys.path.insert(0, {str(REPO / 'experiments')!r})\nfrom calibration import "
    a(22, "simulate_run event='dd' (typo)", cal + "FAMILIES, simulate_run\n"
      "simulate_run(FAMILIES['seed_flip_m256'], 0, event='dd', height=0.2)", ["event", "dd"])
    a(22, "Family num_seeds=2", cal + "Family\nFamily('x', 'per_seed', num_seeds=2)", ["num_seeds"])
    a(22, "calibration split('train')", cal + "split\nsplit('train')", ["train", "tune"])
    a(22, "wilson_interval k > n", cal + "wilson_interval\nwilson_interval(5, 3)", ["k=5", "n=3"])
    a(22, "calibrate_families with an unknown family", cal + "calibrate_families\n"
      "calibrate_families(['no_such_family'], 2)", ["families", "no_such_family"])
    a(22, "rise_test window=0", "from lightning_pfd.analysis.early_stop import rise_test\n"
      "rise_test([0.5] * 10, se=[0.01] * 10, horizon=10, window=0)", ["window"])
    a(22, "bootstrap_collapse method='bogus'", "from lightning_pfd.analysis.scaling import bootstrap_collapse\n"
      "bootstrap_collapse([], method='bogus')", ["method", "bogus"])
    # checkpoint files through the API (need the fixture)
    C.append(Case("api-22", "Python API", "load_checkpoint on a file with flipped bytes",
                  code="from lightning_pfd.checkpoint import load_checkpoint\n"
                       "load_checkpoint('flipped.ckpt')",
                  setup=[ckpt_variant("flipped.ckpt", "flipped", fx)], must=["flipped.ckpt"]))
    C.append(Case("api-23", "Python API", "DiffusionModule.load_from_checkpoint on a truncated file",
                  code="from lightning_pfd.modules import DiffusionModule\n"
                       "DiffusionModule.load_from_checkpoint('half.ckpt')",
                  setup=[ckpt_variant("half.ckpt", "truncated", fx)], must=["half.ckpt"]))
    counters: dict = {}
    for c in C:  # consecutive numbers per prefix (cases were dropped/added over time)
        prefix = c.id.rsplit("-", 1)[0]
        counters[prefix] = counters.get(prefix, 0) + 1
        c.id = f"{prefix}-{counters[prefix]:02d}"
    return C


# --------------------------------------------------------------------------------------------
# running and judging
# --------------------------------------------------------------------------------------------
API_RUNNER = r"""
import json, os, signal, sys, time
cases = json.load(open(sys.argv[1]))

def _alarm(*_):
    raise TimeoutError("case timed out")

signal.signal(signal.SIGALRM, _alarm)
for c in cases:
    os.chdir(c["dir"])
    os.environ["LIGHTNING_PFD_CACHE"] = c["cache"]
    t0 = time.time()
    signal.alarm(int(c["timeout"]))
    try:
        exec(compile(c["code"], "<case " + c["id"] + ">", "exec"), {"__name__": "__case__"})
        r = {"raised": None}
    except BaseException as e:
        r = {"raised": type(e).__name__, "mro": [k.__name__ for k in type(e).__mro__], "msg": str(e)}
    finally:
        signal.alarm(0)
    r.update(id=c["id"], seconds=round(time.time() - t0, 2))
    print("BATTERY_RESULT " + json.dumps(r), flush=True)
"""

NOISE = re.compile(
    r"^(Seed set to|GPU available|TPU available|HPU available|IPU available|💡 Tip|You are using a CUDA"
    r"|`Trainer\(limit_|Trainer already configured|Using default|\[lightning_pfd\] no --config"
    r"|.*Warning: |\s*warnings\.warn|.*warn\(|  rank_zero_warn|/.*\.py:\d+: )")
JSONARGPARSE_NOISE = ("Not a valid subclass", "Subclass types expect",
                      "Does not validate against any of the Union subtypes")
TRAINING_MARKERS = ("`Trainer.fit` stopped", "[lightning_pfd] run finished", "Sanity Checking",
                    "Epoch 0:", "| Name ")


def case_env(d: Path, aux: Path) -> dict:
    aux.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for k in ("LIGHTNING_PFD_DEBUG", "WANDB_API_KEY"):
        env.pop(k, None)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               LIGHTNING_PFD_CACHE=str(d / ".lpfd_cache"), WANDB_MODE="offline",
               WANDB_CONFIG_DIR=str(aux / "wandb_config"), WANDB_CACHE_DIR=str(aux / "wandb_cache"),
               WANDB_DATA_DIR=str(aux / "wandb_data"), MPLCONFIGDIR=str(aux / "mpl"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def snapshot(d: Path) -> dict:
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _clean_lines(text: str) -> List[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip() and not NOISE.match(ln)]


def first_message_line(stderr: str, stdout: str) -> str:
    lines = _clean_lines(stderr)
    for ln in lines:
        if re.search(r"error|Error|Exception", ln) and not ln.startswith("Traceback"):
            return ln.strip()
    if lines:
        return lines[-1].strip()
    out = _clean_lines(stdout)
    return out[-1].strip() if out else ""


def error_block(stderr: str) -> str:
    """From the first error line to the end of stderr (noise removed)."""
    lines = _clean_lines(stderr)
    for i, ln in enumerate(lines):
        if re.search(r"error|Error", ln):
            j = i
            while j > 0 and (lines[j - 1].startswith("usage:") or lines[j - 1].startswith("  ")
                             or lines[j - 1].startswith("     ")):
                j -= 1  # keep an argparse usage above the error line
            return "\n".join(lines[j:])
    return "\n".join(lines)


def prepare(c: Case, root: Path):
    """A fresh case directory with the case's files; returns (dir, snapshot before).
    Command-line cases use ROOT/work (see ``WORK``), API cases ROOT/cases/<id>."""
    d = root / WORK if c.argv is not None else root / "cases" / c.id
    for p in {d, root / "cases" / c.id}:
        if p.exists():
            shutil.rmtree(p)
    d.mkdir(parents=True)
    for fn in c.setup:
        fn(d)
    return d, snapshot(d)


def finish(c: Case, root: Path, d: Path, before: dict, rc, out: str, err: str, dt: float,
           timed_out: bool, api: Optional[dict] = None) -> dict:
    after = snapshot(d)
    if d.name == WORK:  # keep the case's directory for inspection
        (root / "cases").mkdir(exist_ok=True)
        d.rename(root / "cases" / c.id)
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    modified = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    res = {"id": c.id, "area": c.area, "what": c.what, "command": c.command(), "expect": c.expect,
           "rc": rc, "timed_out": timed_out, "seconds": round(dt, 1), "earlier_run": c.earlier,
           "created": created, "modified": modified, "deleted": deleted,
           "traceback": "Traceback (most recent call last)" in (out + err),
           "stdout_tail": "\n".join(out.splitlines()[-15:]),
           "stderr_tail": "\n".join(err.splitlines()[-30:]), "note": c.note,
           "setup": [getattr(fn, "describe", fn.__name__) for fn in c.setup]}
    if c.code is not None:
        api = api or {"raised": "no result (runner crashed or timed out)", "mro": [],
                      "msg": err[-500:]}
        res["exception"] = api.get("raised")
        res["exception_mro"] = api.get("mro", [])
        res["message"] = (api.get("msg") or "").strip()
        res["first_line"] = res["message"].splitlines()[0] if res["message"] else ""
        res["block"] = res["message"]
        res["traceback"] = False  # the runner catches the exception: nothing is printed
    else:
        res["first_line"] = first_message_line(err, out)
        res["block"] = error_block(err)
        res["block_lines"] = len(res["block"].splitlines())
    res["verdict"], res["problems"] = judge(c, res)
    res["severity"] = severity(res)
    return res


def run_case(c: Case, root: Path) -> dict:
    """One command-line case: its own directory, cache, subprocess and timeout."""
    d, before = prepare(c, root)
    env = case_env(d, root / "_aux" / c.id)
    env.update({k: v.format(dir=d, aux=root / "_aux" / c.id) for k, v in c.env.items()})
    t0 = time.time()
    timed_out = False
    limit = c.fsize_limit

    def preexec():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    try:
        if c.signal_when is None:
            cmd = [PY, "-m", "lightning_pfd", *c.argv]
            if c.ro_mount is not None:  # a read-only file system there, for this process only
                ro = str(d / c.ro_mount)
                cmd = ["unshare", "-rm", "sh", "-c", f'mount --bind -o ro "{ro}" "{ro}" && exec "$@"',
                       "sh", *cmd]
            pr = subprocess.run(cmd, cwd=d, env=env, capture_output=True,
                                text=True, timeout=c.timeout, preexec_fn=preexec if limit else None)
            rc, out, err = pr.returncode, pr.stdout, pr.stderr
        else:  # a scheduler's SIGTERM once the file exists
            rc, out, err = _run_and_signal(c, d, env)
    except subprocess.TimeoutExpired as e:
        timed_out, rc = True, None
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    finally:
        stop_holders()
    return finish(c, root, d, before, rc, out, err, time.time() - t0, timed_out)


def _run_and_signal(c: Case, d: Path, env: dict):
    import signal
    import tempfile

    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen([PY, "-m", "lightning_pfd", *c.argv], cwd=d, env=env, stdout=fo, stderr=fe,
                             text=True)
        deadline = time.time() + c.timeout
        while p.poll() is None and not (d / c.signal_when).exists() and time.time() < deadline:
            time.sleep(0.2)
        if p.poll() is None:
            time.sleep(0.5)  # into the next epoch
            p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=max(10, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise
        fo.seek(0)
        fe.seek(0)
        return rc, fo.read(), fe.read()


def run_api_cases(api_cases: List[Case], root: Path) -> List[dict]:
    """The Python API cases: each in its own fresh directory and cache, executed one after the
    other by one runner subprocess (one interpreter start instead of one per case; every call
    has its own SIGALRM timeout and its own exception capture)."""
    prepared = [(c, *prepare(c, root)) for c in api_cases]
    aux = root / "_aux" / "api"
    aux.mkdir(parents=True, exist_ok=True)
    (aux / "runner.py").write_text(API_RUNNER)
    spec = [{"id": c.id, "dir": str(d), "cache": str(d / ".lpfd_cache"), "code": c.code,
             "timeout": c.timeout} for c, d, _ in prepared]
    (aux / "cases.json").write_text(json.dumps(spec))
    env = case_env(aux, aux)
    timed_out = False
    t0 = time.time()
    try:
        pr = subprocess.run([PY, str(aux / "runner.py"), str(aux / "cases.json")], cwd=aux, env=env,
                            capture_output=True, text=True, timeout=60 + 30 * len(spec))
        out, err = pr.stdout, pr.stderr
    except subprocess.TimeoutExpired as e:
        timed_out = True
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    total = time.time() - t0
    got = {}
    for m in re.finditer(r"^BATTERY_RESULT (.*)$", out, re.M):
        r = json.loads(m.group(1))
        got[r["id"]] = r
    results = []
    for c, d, before in prepared:
        r = got.get(c.id)
        dt = r["seconds"] if r else total
        results.append(finish(c, root, d, before, 0 if r else None, "", "" if r else err, dt,
                              timed_out and r is None, api=r))
    return results


def judge(c: Case, r: dict):
    problems: List[str] = []
    text = (r.get("block") or "") + "\n" + (r.get("first_line") or "")
    low = text.lower()
    earlier_changed = [f for f in r["modified"] + r["deleted"] if f not in c.may_change]
    out_low = (r["stderr_tail"] + "\n" + r["stdout_tail"]).lower()
    import fnmatch

    forbidden = [f for f in r["created"] if any(fnmatch.fnmatch(f, g) for g in c.forbid)]
    if forbidden:
        problems.append(f"files that must not be created: {_short(forbidden)}")
    said = [s for s in c.must_not if s.lower() in out_low]
    if said:
        problems.append(f"the message names {said} (not the bad value)")
    if r["timed_out"]:
        return "PROBLEM", [f"timed out after {c.timeout} s"]
    if c.code is not None:  # Python API
        exc, mro = r.get("exception"), r.get("exception_mro") or []
        if exc is None:
            problems.append("no exception: the bad value is accepted by the constructor/call")
        elif "ValueError" not in mro:
            problems.append(f"raises {exc}, not a ConfigError/ValueError")
        missing = [s for s in c.must if s.lower() not in low]
        if exc is not None and missing:
            problems.append(f"message does not name {missing}")
        if exc is not None and c.hint and "did you mean" not in low:
            problems.append("no 'did you mean' for a close name")
        if r["created"]:
            problems.append(f"files written: {r['created'][:4]}")
        return ("fails early + clear" if not problems else "PROBLEM"), problems
    rc = r["rc"]
    if c.expect == "ok":
        if rc != 0:
            problems.append(f"valid input failed with exit status {rc}")
        if r["traceback"]:
            problems.append("traceback printed")
        if c.earlier and not c.may_change_earlier and earlier_changed:
            problems.append(f"earlier run's files changed: {earlier_changed[:4]}")
        missing = [m for m in c.must if m.lower() not in out_low]
        if missing:
            problems.append(f"output does not say {missing}")
        return ("works" if not problems else "PROBLEM"), problems
    if c.expect == "partial":
        if rc not in ((0, 1) if c.status is None else (c.status,)):
            problems.append(f"exit status {rc}" + (f", not {c.status}" if c.status is not None else ""))
        if r["traceback"]:
            problems.append("traceback printed")
        if earlier_changed:
            problems.append(f"earlier run's files changed: {earlier_changed[:4]}")
        missing = [s for s in c.must if s.lower() not in (r["stderr_tail"] + r["stdout_tail"]).lower()]
        if missing:
            problems.append(f"no warning mentioning {missing}")
        return ("works" if not problems else "PROBLEM"), problems
    if c.expect in ("signal", "env"):  # stopped by SIGTERM (143) / the environment failed (1)
        want = 143 if c.expect == "signal" else 1
        if rc != want:
            problems.append(f"exit status {rc}, not {want}")
        if r["traceback"]:
            problems.append("traceback printed")
        if c.earlier and not c.may_change_earlier and earlier_changed:
            problems.append(f"earlier run's files changed: {earlier_changed[:4]}")
        if c.expect == "env":
            damaged = [f for f in earlier_changed if f.endswith((".ckpt", "config.yaml"))]
            if damaged:
                problems.append(f"earlier run's checkpoint/config changed: {damaged[:4]}")
        out_text = (r["stderr_tail"] + r["stdout_tail"]).lower()
        missing = [m for m in c.must if m.lower() not in out_text]
        if missing:
            problems.append(f"message does not name {missing}")
        return ("fails early + clear" if c.expect == "env" and not problems else
                "works" if not problems else "PROBLEM"), problems
    if c.expect == "debug":
        if rc in (0, None):
            problems.append("a bad value was accepted")
        if not r["traceback"]:
            problems.append("--debug printed no traceback")
        if r["created"] or earlier_changed:
            problems.append(f"files written: {r['created'][:4]}")
        return ("works" if not problems else "PROBLEM"), problems
    # expect == "error"
    started = any(mk in (r["stdout_tail"] + r["stderr_tail"]) for mk in TRAINING_MARKERS) or any(
        f.endswith((".ckpt", "metrics.csv", "hparams.yaml", "config.yaml"))
        for f in r["created"] + r["modified"])
    if rc == 0:
        problems.append("bad input accepted (exit status 0)")
    elif rc != 2:
        problems.append(f"exit status {rc}, not 2")
    if r["traceback"]:
        problems.append("traceback printed")
    if started and rc != 0:
        problems.append("failed late: after training / logging had started")
    if r["created"]:
        problems.append(f"files written by the failed run: {_short(r['created'])}")
    if earlier_changed:
        problems.append(f"earlier run's files changed/deleted: {_short(earlier_changed)}")
    if rc != 0 and not r["first_line"]:
        problems.append("no error message")
    missing = [s for s in c.must if s.lower() not in low]
    if rc != 0 and missing:
        problems.append(f"message does not name {missing}")
    if rc != 0 and c.hint and "did you mean" not in low:
        problems.append("no 'did you mean' for a close name")
    noise = [n for n in JSONARGPARSE_NOISE if n.lower() in low]
    if rc != 0 and noise:
        problems.append(f"message carries misleading parser noise {noise} (the class is valid; "
                        "only one argument is bad)")
    usage = (r.get("block") or "").lstrip().startswith("usage:")
    if rc != 0 and usage and r.get("block_lines", 0) > 3:
        problems.append(f"argparse usage dump ({r['block_lines']} lines) above the one-line error, "
                        "not one short block")
    elif rc != 0 and r.get("block_lines", 0) > 15:
        problems.append(f"message is {r['block_lines']} lines, not one short block")
    return ("fails early + clear" if not problems else "PROBLEM"), problems


MAJOR = ("traceback", "failed late", "files written", "earlier run", "accepted", "exit status",
         "timed out", "no exception", "valid input failed")


def severity(r: dict) -> Optional[str]:
    """PROBLEM cases: "major" (traceback, late failure, files written/damaged, bad input
    accepted, wrong exit status) or "minor" (only the message or the exception type)."""
    if r["verdict"] != "PROBLEM":
        return None
    return "major" if any(any(k in p for k in MAJOR) for p in r["problems"]) else "minor"


def _short(files: List[str], n: int = 4) -> str:
    s = ", ".join(files[:n])
    return s + (f", ... ({len(files)} files)" if len(files) > n else "")


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------
def _md(s: str, n: int = 140) -> str:
    s = " ".join(str(s).split())
    if len(s) > n:
        s = s[: n - 1] + "…"
    return s.replace("|", "\\|").replace("`", "'")


def outcome(r: dict) -> str:
    if r.get("timed_out"):
        return "timeout"
    if "exception" in r:
        return r["exception"] or "no exception"
    return f"exit {r['rc']}" + (" + traceback" if r["traceback"] else "")


def files_touched(r: dict) -> str:
    parts = []
    if r["created"]:
        parts.append(f"created {len(r['created'])}: {_short(r['created'], 2)}")
    ch = r["modified"] + r["deleted"]
    if ch:
        parts.append(("earlier run changed" if r["earlier_run"] else "changed") + f": {_short(ch, 2)}")
    if not parts:
        return "none" + (" (earlier run intact)" if r["earlier_run"] else "")
    return "; ".join(parts)


def table_md(results: List[dict]) -> str:
    rows = ["| case | area | input | outcome | message (first line) | files touched | verdict |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = r["verdict"] if r["verdict"] != "PROBLEM" else "**PROBLEM**"
        rows.append(f"| {r['id']} | {r['area']} | {_md(r['what'], 70)} | {_md(outcome(r))} | "
                    f"{_md(r['first_line'], 150)} | {_md(files_touched(r), 90)} | {verdict} |")
    return "\n".join(rows)


def problems_md(results: List[dict]) -> str:
    bad = [r for r in results if r["verdict"] == "PROBLEM"]
    if not bad:
        return "No PROBLEM case in this run."
    out = []
    for r in bad:
        out.append(f"### {r['id']} ({r['area']}, {r['severity']}): {r['what']}\n")
        if r["command"].startswith("python: "):
            out.append("```python\n" + r["command"][len("python: "):].replace("; ", "\n") + "\n```\n")
        else:
            out.append(f"```\n{r['command']}\n```\n")
        if r.get("setup"):
            out.append("- in a fresh directory holding: " + "; ".join(r["setup"]))
        out.append("- outcome: " + outcome(r))
        for p in r["problems"]:
            out.append(f"- {p}")
        msg = r.get("block") or r.get("first_line") or ""
        if r["traceback"]:
            tail = [ln for ln in r["stderr_tail"].splitlines() if ln.strip()][-3:]
            msg = "\n".join(tail)
        if msg:
            out.append("- message:\n\n```\n" + "\n".join(msg.splitlines()[:8]) + "\n```")
        out.append("")
    return "\n".join(out)


def summary_md(results: List[dict], seconds: float) -> str:
    counts = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    parts = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    carried = [r for r in results if r.get("carried")]
    if not any("carried" in r for r in results):  # one run
        return f"{len(results)} cases in {seconds / 60:.1f} min — {parts}."
    fresh = [r for r in results if not r.get("carried")]
    rest = (f"; the other {len(carried)} carried over from the earlier full run, marked `carried` in "
            "the JSON") if carried else ""
    return (f"{len(results)} cases — {parts} ({len(fresh)} run on {fresh[0].get('run', '?')} in subsets "
            f"(--merge), {sum(r['seconds'] for r in fresh) / 60:.1f} min of case time{rest}).")


#: the tag of this run's results (``--run``; a --merge keeps results of the same tag as fresh)
RUN = time.strftime("%Y-%m-%d")

#: earlier results a --merge run starts from (a case re-run replaces its entry)
CARRY = (RESULTS_JSON,)


def merge_results(fresh: List[dict], all_cases: List[Case], paths) -> List[dict]:
    """``fresh`` results plus, for every other case, its entry in the earlier result files
    (marked ``carried``), in the order of the case list."""
    earlier = {}
    for path in paths:  # the first file that holds a case wins
        try:
            for r in json.loads(Path(path).read_text()).get("cases", []):
                earlier.setdefault(r["id"], dict(r))
        except (OSError, ValueError):
            continue
    for r in earlier.values():  # re-run earlier in this --run (another subset): not carried
        r["carried"] = r.get("run") != RUN
    now = {r["id"]: r for r in fresh}
    return [now.get(c.id) or earlier[c.id] for c in all_cases if c.id in now or c.id in earlier]


README = REPO / "README.md"
#: README's sentence on the battery (generated: tests/test_quoted_numbers.py checks it)
README_MARKERS = ("<!-- battery-readme -->", "<!-- /battery-readme -->")


def readme_sentence(results: List[dict]) -> str:
    """README's summary of the recorded battery: cases, verdicts, case time."""
    count = lambda v: sum(r["verdict"] == v for r in results)  # noqa: E731
    return (f"{len(results)} cases, {count('fails early + clear')} fail early and clearly, "
            f"{count('works')} work, {count('PROBLEM')} problems "
            f"({sum(r['seconds'] for r in results) / 60:.1f} min of case time on 2 cores)")


def update_readme(results: List[dict]) -> None:
    text = README.read_text()
    start, end = README_MARKERS
    if start in text and end in text:
        pre, rest = text.split(start, 1)
        _, post = rest.split(end, 1)
        README.write_text(f"{pre}{start}{readme_sentence(results)}{end}{post}")


def update_docs(results: List[dict], seconds: float) -> None:
    update_readme(results)
    if not DOCS.exists():
        return
    text = DOCS.read_text()
    for name, body in (("summary", summary_md(results, seconds)), ("table", table_md(results)),
                       ("problems", problems_md(results))):
        start, end = f"<!-- battery:{name}:start -->", f"<!-- battery:{name}:end -->"
        if start in text and end in text:
            pre, rest = text.split(start, 1)
            _, post = rest.split(end, 1)
            text = f"{pre}{start}\n{body}\n{end}{post}"
    DOCS.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="scratch directory for the case directories")
    ap.add_argument("--only", default=None, help="comma-separated case ids")
    ap.add_argument("--area", default=None, help="run only this area")
    ap.add_argument("--write", action="store_true", help="write JSON/docs even for a subset")
    ap.add_argument("--no-docs", action="store_true", help="do not update docs/reliability.md")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--merge", action="store_true",
                    help="a subset's results replace their cases in the recorded JSON (and the faults "
                         "JSON); the other cases are carried over, marked; JSON and docs rewritten")
    ap.add_argument("--json", default=str(RESULTS_JSON),
                    help="where --write / a full run writes the results (default: %(default)s)")
    ap.add_argument("--run", default=None, help="tag of this run's results (default: today's date)")
    ap.add_argument("--docs-only", action="store_true",
                    help="rewrite docs/reliability.md's blocks and README's sentence from the recorded "
                         "JSON (--json), running no case")
    args = ap.parse_args(argv)
    if args.docs_only:
        rec = json.loads(Path(args.json).read_text())
        update_docs(rec["cases"], rec["seconds"])
        return 0
    global RUN
    RUN = args.run or RUN
    root = Path(args.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    fx_placeholder = root / "fixture_earlier_run"
    all_cases = cases(fx_placeholder)
    if args.list:
        for c in all_cases:
            print(f"{c.id:10} {c.area:12} {c.what}")
        print(len(all_cases), "cases")
        return 0
    sel = all_cases
    if args.only:
        ids = set(args.only.split(","))
        sel = [c for c in sel if c.id in ids]
    if args.area:
        sel = [c for c in sel if c.area == args.area]
    t0 = time.time()
    build_fixture(root, timeout=300)
    results = []

    def show(i, r):
        flag = "" if r["verdict"] != "PROBLEM" else "  <-- " + "; ".join(r["problems"])
        print(f"[{i:3d}/{len(sel)}] {r['id']:10} {r['seconds']:5.1f}s {outcome(r):22} {r['verdict']}{flag}",
              flush=True)

    for c in sel:
        if c.argv is not None:
            results.append(run_case(c, root))
            show(len(results), results[-1])
    api = [c for c in sel if c.code is not None]
    if api:
        for r in run_api_cases(api, root):
            results.append(r)
            show(len(results), r)
    for r in results:
        r["run"] = RUN
    order = {c.id: i for i, c in enumerate(sel)}
    results.sort(key=lambda r: order[r["id"]])
    seconds = time.time() - t0
    (root / "table.md").write_text(summary_md(results, seconds) + "\n\n" + table_md(results) + "\n\n"
                                   + problems_md(results) + "\n")
    full = len(sel) == len(all_cases)
    if args.merge and not full:
        results = merge_results(results, all_cases, CARRY)
    if full or args.write or args.merge:
        import platform

        out_json = Path(args.json)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps({
            "summary": summary_md(results, seconds), "seconds": round(seconds, 1),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "tiny_config": TINY,
            "cases": results}, indent=1))
        if not args.no_docs:
            update_docs(results, seconds)
    print(summary_md(results, seconds))
    print(f"table: {root / 'table.md'}" + (f"; json: {args.json}" if full or args.write or args.merge else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
