"""One benchmark table: every measurement of lightning_pfd against its floor, in one process run.

    python benchmarks/run.py               # <= 10 min on 2 shared CPU cores; writes results.json / .md
    python benchmarks/run.py --quick       # ~3 min smoke version (smaller sizes, fewer rounds)
    python benchmarks/run.py --sections compile memory   # the long, optional sections

Each measurement is timed against a *floor*, the work it cannot avoid, measured in the same
process and interleaved with it round by round (the machine is shared: only ratios under the same
load mean something). Reported: best-of-rounds wall time of both, their ratio (and the ratio of
process CPU times, less sensitive to other processes), and the peak memory increase of one call:
Linux VmHWM after minus VmRSS before (the high-water mark reset through /proc/self/clear_refs,
glibc's free heap trimmed first), measured in separate untimed rounds in which glibc serves every
allocation >= 64 KiB by mmap, so that freed tensors leave the resident set; on CUDA also
``torch.cuda.max_memory_allocated``. Subprocesses report their maximum RSS.

Sections (``--sections``; default: empirical monitors training quickstart budget):

* ``empirical``: the mixed-precision ``EmpiricalDenoiser`` on the 35 calls of a Heun-18 flow vs
  the float32 and float64 matmuls of the same shapes (``benchmarks/bench_empirical.py``), and the
  float64 denoiser vs the float64 matmuls.
* ``monitors``: the quickstart (``lightning_pfd/configs/quickstart.yaml``: MLP student, 64-d GMM
  teacher data, N = 64) with its monitors' init args, each timed inside ``trainer.validate`` (and
  ICR on the U-Net of configs/experiments/icr_unet_large.yaml):
  ``GeneralizationMonitor`` (warm: references loaded, per epoch; cold: references computed) vs
  M x 35 bare student forwards (cold: + the teacher's and the empirical denoiser's M x 35 calls);
  ``ICRMonitor`` vs its 2n truncated forwards (to the tap); ``MemorizationMonitor`` vs
  ``generate`` + an exact nearest-neighbour search; ``TailMonitor`` (observable ``max`` of the
  held-out set) vs ``generate`` + one KDE-based LOADER.
* ``training``: Lightning training steps of the quickstart module vs a plain PyTorch loop (same
  net, batch, EDM loss, fused Adam, EMA), interleaved in windows of steps inside one fit.
* ``quickstart``: ``python -m lightning_pfd fit`` (the embedded quickstart, ``--epochs`` epochs) in
  a subprocess with a cold and a warm cache, and without callbacks (its floor).
* ``budget``: the fraction of a paper-scale run spent measuring (distill_vp_cifar10, edm_cifar10,
  icr_unet_large) from FLOP counts of their nets, every epoch, with the ``log`` schedule and with
  the validation loop limited (docs/performance.md).
* ``compile`` (optional, minutes of C++ compilation): compiled vs eager student sampling for the
  MLP and the ``unet1`` preset: compile time once, then per-evaluation time.
* ``memory`` (optional): the empirical reference of FlowEvaluation at M, N, D = ``--mem-size``
  (mixed denoiser), peak RSS against the bound of docs/performance.md.

Sections not run keep their previous entries in results.json (each with its own commit and date);
results.md is rebuilt from all of them.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI does (lightning_pfd.threads)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

RESULTS_JSON = ROOT / "benchmarks" / "results.json"
RESULTS_MD = ROOT / "benchmarks" / "results.md"
DEFAULT_SECTIONS = ("empirical", "monitors", "per_unit", "training", "quickstart", "budget")
ALL_SECTIONS = DEFAULT_SECTIONS + ("compile", "memory")
GOALS = {"monitor": 1.2, "training": 0.95, "per_unit": 0.05}  # monitor time / floor <= 1.2; training speed / plain >= 0.95; per-seed records <= 5 % of the measurement

#: the quickstart's model, data and monitor arguments (lightning_pfd/configs/quickstart.yaml)
QS_NET = dict(dim=64, hidden=256, depth=4)
QS_DATA = dict(teacher="gmm_digits", n_components=10, n_train=64, n_test=512, batch_size=64, samples_per_epoch=16000)
QS_GEN = dict(num_eval=256, num_loss_samples=512)
QS_ICR = dict(num_images=64, views_per_image=4, d_proj=16, image_shape=[1, 8, 8], level=1)
QS_MEM = dict(num_samples=128, every_n_epochs=1, criterion="nn_ratio")
QS_TAIL = dict(num_samples=256, reference="val", observable="max")  # not in the quickstart: heavy-tail runs
NFE = 35  # Heun-18
#: judge goals on process CPU time (set by main for one thread: then CPU time is the work done, and
#: wall time adds the waits for a core that other processes hold); else on wall time
JUDGE = {"on_cpu": True}


def _judge(wall: float, cpu: Optional[float], op: str) -> bool:
    goal = GOALS["monitor"] if op == "<=" else GOALS["training"]
    value = cpu if JUDGE["on_cpu"] and cpu is not None else wall
    return value <= goal if op == "<=" else value >= goal


# ----------------------------------------------------------------------------- measuring helpers
def _status_kb(field: str, pid="self") -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def track_large_allocations(threshold: int = 64 * 1024) -> bool:
    """glibc: serve every allocation >= ``threshold`` bytes by mmap (no dynamic threshold), so a
    freed tensor leaves the resident set and the next call's peak is its own. Slows allocation
    down: only for the untimed memory rounds."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(-3, int(threshold)))  # M_MMAP_THRESHOLD = -3


class Peak:
    """Peak memory increase of a block: ``mb`` (resident set, MB; None where /proc is missing)
    and ``cuda_mb`` (allocated CUDA memory, when CUDA is available); wall and CPU seconds."""

    def __enter__(self) -> "Peak":
        gc.collect()
        libc = _libc()
        if libc is not None:
            libc.malloc_trim(0)  # free heap pages back first: the increase is this block's
        self._ok = _reset_peak()
        self._rss0 = _status_kb("VmRSS")
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self._cuda0 = torch.cuda.memory_allocated()
        self._t, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t
        self.cpu_seconds = time.process_time() - self._c
        hwm = _status_kb("VmHWM")
        self.mb = (hwm - self._rss0) / 1024 if self._ok and hwm is not None and self._rss0 is not None else None
        self.cuda_mb = ((torch.cuda.max_memory_allocated() - self._cuda0) / 2**20) if self.cuda else None


class Record:
    """Times (wall, CPU) and peak memory of named measurements over rounds. In ``memory_mode``
    (untimed rounds with :func:`track_large_allocations`) only the peak is kept, as
    ``tracked_peak_mb``: the number reported."""

    def __init__(self):
        self.rows: Dict[str, Dict[str, list]] = {}
        self.memory_mode = False

    def add(self, name: str, peak: Peak) -> None:
        r = self.rows.setdefault(name, {"seconds": [], "cpu_seconds": [], "peak_mb": [], "cuda_peak_mb": [],
                                        "tracked_peak_mb": []})
        if self.memory_mode:
            if peak.mb is not None:
                r["tracked_peak_mb"].append(peak.mb)
            return
        r["seconds"].append(peak.seconds)
        r["cpu_seconds"].append(peak.cpu_seconds)
        if peak.mb is not None:
            r["peak_mb"].append(peak.mb)
        if peak.cuda_mb is not None:
            r["cuda_peak_mb"].append(peak.cuda_mb)

    def measure(self, name: str, fn: Callable, *args, **kwargs):
        with Peak() as p:
            out = fn(*args, **kwargs)
        self.add(name, p)
        return out

    def best(self, name: str, key: str = "seconds") -> float:
        return min(self.rows[name][key])

    def summary(self, name: str) -> dict:
        r = self.rows[name]
        peak = r["tracked_peak_mb"] or r["peak_mb"]
        return {"seconds": min(r["seconds"]), "cpu_seconds": min(r["cpu_seconds"]), "rounds": len(r["seconds"]),
                "all_seconds": r["seconds"], "peak_mb": max(peak) if peak else None,
                "peak_tracked": bool(r["tracked_peak_mb"]),
                "cuda_peak_mb": max(r["cuda_peak_mb"]) if r["cuda_peak_mb"] else None}

    def combine(self, name: str, parts: List[str]) -> None:
        """``name`` = round-by-round sum of ``parts`` (rounds where all of them were measured);
        peak = the largest part's."""
        rows = [self.rows[p] for p in parts]
        n = min(len(r["seconds"]) for r in rows)
        self.rows[name] = {k: ([sum(r[k][i] for r in rows) for i in range(n)] if k in ("seconds", "cpu_seconds")
                               else [max(v for r in rows for v in r[k])] if any(r[k] for r in rows) else [])
                           for k in rows[0]}

    def ratio(self, name: str, floor: str, goal: Optional[float] = None, what: str = "", floor_what: str = "") -> dict:
        """time(name) / time(floor): best over rounds (wall and CPU) and the median of the
        per-round paired ratios."""
        a, b = self.rows[name], self.rows[floor]
        paired = [x / y for x, y in zip(a["seconds"], b["seconds"])]
        out = {"measured": what or name, "floor": floor_what or floor, **self.summary(name),
               "floor_seconds": self.best(floor), "floor_cpu_seconds": self.best(floor, "cpu_seconds"),
               "floor_peak_mb": self.summary(floor)["peak_mb"],
               "ratio": self.best(name) / self.best(floor),
               "ratio_cpu": self.best(name, "cpu_seconds") / max(self.best(floor, "cpu_seconds"), 1e-9),
               "ratio_paired_median": statistics.median(paired) if paired else None}
        if goal is not None:
            out["goal"] = f"<= {goal}"
            out["meets_goal"] = _judge(out["ratio"], out["ratio_cpu"], "<=")
        return out


# ----------------------------------------------------------------------------- section: empirical
def section_empirical(args) -> dict:
    """Mixed / float64 EmpiricalDenoiser vs float32 / float64 matmul floors (bench_empirical.run)."""
    import bench_empirical as be

    if args.quick:
        res = be.run(quick=True, threads=args.threads)
    else:  # a size that fits the 10-minute budget here (the full N = 4096, M = 1024 takes ~15 min)
        res = be.run(threads=args.threads, config=dict(n=2048, shape=(3, 32, 32), m=256, repeats=2))
    rows = []
    for data in ("smooth", "iid"):
        r = res[data]
        rows.append({"measured": f"EmpiricalDenoiser mixed ({data} data)", "floor": "float32 matmuls, same shapes",
                     "ratio": 1 / r["rate_vs_float32"], "goal": "<= 1/0.9 = 1.11",
                     "meets_goal": r["rate_vs_float32"] >= 0.9, "all_within_1e-9": r["all_within_1e-9"]})
        rows.append({"measured": f"EmpiricalDenoiser mixed ({data} data)", "floor": "float64 matmuls, same shapes",
                     "ratio": 1 / r["rate_vs_float64_floor"]})
        rows.append({"measured": f"EmpiricalDenoiser float64 ({data} data)", "floor": "float64 matmuls, same shapes",
                     "ratio": 1 / r["float64_vs_float64_floor"]})
    for r in (res["smooth"], res["iid"]):
        r.pop("per_call", None)  # keep the JSON small (bench_empirical.py prints them)
    return {"config": res["config"], "rows": rows, "raw": {k: res[k] for k in ("smooth", "iid")}}


# ----------------------------------------------------------------------------- section: monitors
def _quickstart_parts(train_steps: int, root: str):
    import lightning.pytorch as pl

    from lightning_pfd.data import TeacherDistillationDataModule
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    pl.seed_everything(0, verbose=False)
    dm = TeacherDistillationDataModule(**QS_DATA)
    model = DiffusionModule(MLPNet(**QS_NET), family="edm", lr=1e-3, ema_decay=0.995)
    if train_steps:
        pl.Trainer(accelerator="cpu", devices=1, max_steps=train_steps, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                   default_root_dir=root).fit(model, datamodule=dm)
    return dm, model


def _bare_forwards(den, n: int, shape, batch: int, nfe: int, sigma: float = 1.0) -> None:
    """``nfe`` passes of the denoiser over n inputs in batches: the floor of a PF-ODE flow."""
    x = torch.randn(n, *shape)
    s = torch.tensor(sigma, dtype=torch.float64)
    for _ in range(nfe):
        for b in x.split(batch):
            den(b, s)


def _truncated_forwards(den, n: int, shape, batch: int, tap: Optional[str], sigma: float) -> None:
    """n forwards of the net stopped at ``tap``: the floor of ICR's feature extraction."""
    from lightning_pfd.diffusion.features import tap_features

    x = torch.randn(n, *shape)
    for b in x.split(batch):
        tap_features(den.net, *den.network_input(b, sigma), tap)


def _nearest_neighbours(samples: torch.Tensor, train: torch.Tensor) -> None:
    d = torch.cdist(samples.reshape(len(samples), -1).double(), train.reshape(len(train), -1).double())
    d.topk(2, dim=1, largest=False)


def _icr_unet_rounds(rec: "Record", rounds: int) -> None:
    """ICR on the shipped ICR experiment's U-Net (configs/experiments/icr_unet_large.yaml: 1 x 16 x
    16, 1024 images, one view pair each, d_proj 16) vs its 2n truncated forwards: where the network,
    not the view generation, dominates."""
    from lightning_pfd.evaluation.representation import RepresentationEvaluation
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import UNet

    torch.manual_seed(0)
    model = DiffusionModule(UNet(img_resolution=16, in_channels=1, model_channels=16, channel_mult=[1, 2],
                                 num_blocks=1, attn_resolutions=[]), family="edm")
    data = torch.rand(1024, 1, 16, 16) * 2 - 1
    ev = RepresentationEvaluation(data, num_images=None, sigma=0.29, level=1, views_per_image=1, d_proj=16, seed=1)
    ev.evaluate(model)  # warm-up
    with torch.no_grad():
        for r in range(rounds):
            pair = [("icr_unet", lambda: ev.evaluate(model)),
                    ("floor_icr_unet", lambda: _truncated_forwards(model.denoiser, 2 * 1024, (1, 16, 16), 256,
                                                                   None, 0.29))]
            for name, fn in (pair if r % 2 == 0 else pair[::-1]):
                rec.measure(name, fn)


def section_monitors(args) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    from lightning_pfd.cache import cache_dir
    from lightning_pfd.callbacks import GeneralizationMonitor, ICRMonitor, MemorizationMonitor, TailMonitor
    from lightning_pfd.diffusion import EmpiricalDenoiser
    from lightning_pfd.metrics.tails import loader

    root = tempfile.mkdtemp(prefix="pfd_bench_monitors_")
    dm, model = _quickstart_parts(50 if args.quick else 250, root)
    rec = Record()
    mons = {"generalization": GeneralizationMonitor(**QS_GEN),
            "icr": ICRMonitor(**QS_ICR),
            "memorization": MemorizationMonitor(**QS_MEM),
            "tail": TailMonitor(**QS_TAIL, plot=False),
            "tail_plot": TailMonitor(**QS_TAIL, plot=True, name="tailplot")}
    state = {"cold": False}

    def timed_measure(name, mon):
        orig = mon._measure_and_log

        def run(trainer, pl_module):
            label = "generalization_cold" if name == "generalization" and state["cold"] else name
            rec.measure(label, orig, trainer, pl_module)
        mon._measure_and_log = run

    for name, mon in mons.items():
        timed_measure(name, mon)
    gen = mons["generalization"]

    class References(Callback):
        """The monitor's references (teacher + empirical flows), timed apart from its per-epoch
        measurement: prepared at the start of each validation round."""

        def on_validation_start(self, trainer, pl_module):
            rec.measure("references_computed" if state["cold"] else "references_loaded", gen.prepare,
                        trainer, pl_module)

    class Floors(Callback):
        """The floors, measured in the same validation epoch as the monitors."""

        def on_validation_epoch_start(self, trainer, pl_module):
            for name in ("tail", "tail_plot"):  # once per run in a fit: not part of an epoch's cost
                ev = mons[name].evaluation
                if ev.data is not None and ev._floors is None:
                    rec.measure("tail_setup_once", ev.floors)

        def on_validation_epoch_end(self, trainer, pl_module):
            den, shape = pl_module.denoiser, tuple(dm.train_data.shape[1:])
            M, B = QS_GEN["num_eval"], gen.evaluation.batch_size
            rec.measure("floor_student_flow", _bare_forwards, den, M, shape, B, NFE)
            rec.measure("floor_student_flow_and_losses", lambda: (
                _bare_forwards(den, M, shape, B, NFE),
                _bare_forwards(den, 2 * QS_GEN["num_loss_samples"], shape, B, 1)))
            if state["cold"]:  # the denoiser the evaluation builds (float64 algorithm for N <= 256 on a CPU)
                emp = EmpiricalDenoiser(dm.train_data)
                rec.measure("floor_cold", lambda: (_bare_forwards(den, M, shape, B, NFE),
                                                    _bare_forwards(dm.teacher, M, shape, B, NFE),
                                                    _bare_forwards(emp, M, shape, B, NFE),
                                                    _bare_forwards(den, 2 * QS_GEN["num_loss_samples"], shape, B, 1)))
            icr = mons["icr"].evaluation
            # the measurement without the monitor's logging (the monitor's own evaluation object)
            rec.measure("icr_measure", icr.evaluate, pl_module)
            rec.measure("floor_icr", _truncated_forwards, den, 2 * icr.num_images * icr.views_per_image, shape,
                        icr.batch_size, icr.tap, icr.sigma)
            n_mem = QS_MEM["num_samples"]
            rec.measure("floor_memorization", lambda: _nearest_neighbours(
                pl_module.generate(torch.arange(n_mem), batch_size=mons["memorization"].evaluation.batch_size), dm.train_data))
            ref_obs = mons["tail"].evaluation.reference_observable

            def tail_floor():
                x = pl_module.generate(torch.arange(QS_TAIL["num_samples"]), batch_size=256)
                loader(x.reshape(len(x), -1).amax(1).double(), ref_obs)
            rec.measure("floor_tail", tail_floor)

    floors = Floors()
    rounds = 4 if args.quick else 8

    def one_round(r: int, cold: bool) -> None:
        state["cold"] = cold
        if cold:
            shutil.rmtree(cache_dir() / "pfd", ignore_errors=True)
        cbs = list(mons.values())
        cbs = [References(), *([floors, *cbs] if r % 2 else [*cbs, floors])]  # alternate: floors before / after the monitors
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                             default_root_dir=root, callbacks=cbs)
        trainer.validate(model, datamodule=dm, verbose=False)

    for r in range(rounds):  # timed: cold every other round
        one_round(r, r % 2 == 0)
    rec.memory_mode = track_large_allocations()  # then one cold and one warm round for the peaks
    if rec.memory_mode:
        one_round(0, True)
        one_round(1, False)
    rec.combine("generalization_cold_total", ["references_computed", "generalization_cold"])
    if not args.quick:
        rec.memory_mode = False
        _icr_unet_rounds(rec, 3)
    goal = GOALS["monitor"]
    M = QS_GEN["num_eval"]
    rows = [
        rec.ratio("generalization", "floor_student_flow", goal, "GeneralizationMonitor, per epoch (warm)",
                  f"M x 35 student forwards (M = {M})"),
        rec.ratio("generalization", "floor_student_flow_and_losses", None, "GeneralizationMonitor, per epoch (warm)",
                  f"M x 35 + 2 x {QS_GEN['num_loss_samples']} loss forwards"),
        rec.ratio("generalization_cold_total", "floor_cold", goal, "GeneralizationMonitor, first epoch (cold cache: "
                  "teacher + empirical references computed)", "student + teacher + empirical M x 35 calls "
                  f"+ 2 x {QS_GEN['num_loss_samples']} loss forwards"),
        rec.ratio("references_computed", "floor_cold", None, "of which: references computed (once per cache key)",
                  "the same"),
        rec.ratio("references_loaded", "floor_student_flow", None, "GeneralizationMonitor, references loaded "
                  "(warm cache, once per run)", "M x 35 student forwards"),
        rec.ratio("icr", "floor_icr", goal, "ICRMonitor", f"2n truncated forwards (n = {64 * 4} view pairs)"),
        rec.ratio("icr_measure", "floor_icr", None, "of which: RepresentationEvaluation.evaluate (no logging)",
                  "the same"),
        rec.ratio("memorization", "floor_memorization", goal, "MemorizationMonitor",
                  f"generate({QS_MEM['num_samples']}) + exact 2-NN"),
        rec.ratio("tail", "floor_tail", goal, "TailMonitor (plot=False)",
                  f"generate({QS_TAIL['num_samples']}) + one LOADER"),
        rec.ratio("tail_plot", "floor_tail", None, "TailMonitor (plot=True: + density figure)",
                  f"generate({QS_TAIL['num_samples']}) + one LOADER"),
    ]
    if "icr_unet" in rec.rows:
        rows.append(rec.ratio("icr_unet", "floor_icr_unet", goal, "ICR measurement on icr_unet_large's U-Net "
                              "(RepresentationEvaluation, 1024 pairs)", "2n truncated forwards"))
    shutil.rmtree(root, ignore_errors=True)
    return {"config": {"net": QS_NET, "data": QS_DATA, "generalization": QS_GEN, "icr": QS_ICR,
                       "memorization": QS_MEM, "tail": QS_TAIL, "rounds": rounds},
            "rows": rows, "once": {k: rec.summary(k) for k in ("tail_setup_once",) if k in rec.rows}}


# ----------------------------------------------------------------------------- section: per_unit
def section_per_unit(args) -> dict:
    """What keeping the per-seed values costs the GeneralizationMonitor's measurement: the per-seed
    squared distances of E_gen and E_mem, their standard errors and the two record files
    (``FlowEvaluation._per_seed`` + ``pfd_standard_error`` + ``PerUnitStore.write``), against the
    whole ``FlowEvaluation.evaluate`` (student flow, metrics, losses, per-seed part included), on
    the quickstart (M = 256). Goal: <= 0.05."""
    from lightning_pfd.analysis.per_unit import PerUnitStore, UnitRecord
    from lightning_pfd.evaluation.flow import FlowEvaluation, pfd_standard_error

    root = tempfile.mkdtemp(prefix="pfd_bench_per_unit_")
    dm, model = _quickstart_parts(50 if args.quick else 250, root)
    dm.setup("fit")
    ev = FlowEvaluation.from_datamodule(dm, model, num_eval=QS_GEN["num_eval"],
                                        num_loss_samples=QS_GEN["num_loss_samples"])
    ev.compute_references("cpu")
    den = model.denoiser
    store = PerUnitStore(Path(root) / "per_unit")
    feats = ev.features(ev.sample_student(den))
    shard = torch.arange(ev.num_eval)

    def per_unit_part(epoch: int) -> None:
        per = ev._per_seed(feats, shard, False, torch.device("cpu"))
        for k, sq in per.items():
            store.write(UnitRecord(k, epoch, epoch, "sq_dist", sq.numpy(), ev.seeds.numpy(),
                                   float(pfd_standard_error(sq))))

    rec = Record()
    for r in range(4 if args.quick else 8):
        rec.measure("measure", ev.evaluate, den, loss_fn=model.loss_fn)
        rec.measure("per_unit", per_unit_part, r)
    rows = [rec.ratio("per_unit", "measure", GOALS.get("per_unit", 0.05),
                      "per-seed d² of E_gen and E_mem, their s.e. and two record files",
                      f"FlowEvaluation.evaluate (quickstart, M = {QS_GEN['num_eval']})")]
    shutil.rmtree(root, ignore_errors=True)
    return {"config": {"generalization": QS_GEN}, "rows": rows}


# ----------------------------------------------------------------------------- section: training
def _bare_module(net, lr: float = 1e-3, decay: float = 0.995):
    """The plain loop's work as a minimal LightningModule: EDM loss, fused Adam, EMA lerp; no
    seeding, gradient guard or logging -- the cost of Lightning's loop alone."""
    import lightning.pytorch as pl

    from lightning_pfd.diffusion import EDMFamily

    class Bare(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.live_denoiser, self.loss = EDMFamily().precondition(net), EDMFamily().loss()
            self.ema = [p.detach().clone() for p in self.live_denoiser.parameters()]

        def training_step(self, batch, batch_idx):
            y = batch[0] if isinstance(batch, (list, tuple)) else batch
            return self.loss(self.live_denoiser, y).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            with torch.no_grad():
                torch._foreach_lerp_(self.ema, [p.detach() for p in self.live_denoiser.parameters()], 1 - decay)

        def configure_optimizers(self):
            return torch.optim.Adam(self.live_denoiser.parameters(), lr=lr, fused=True)

    return Bare()


def _training_case(net_args: dict, windows_n: int, every: int = 25, bare: bool = False) -> dict:
    """Lightning steps of the quickstart module with ``MLPNet(**net_args)`` (``bare``: of a minimal
    LightningModule doing the plain loop's work) vs a plain PyTorch loop, interleaved: every
    ``every`` Lightning steps, ``every`` plain steps (timed apart)."""
    import copy

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    from lightning_pfd.data import TeacherDistillationDataModule
    from lightning_pfd.diffusion import EDMFamily
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    root = tempfile.mkdtemp(prefix="pfd_bench_train_")
    pl.seed_everything(0, verbose=False)
    dm = TeacherDistillationDataModule(**QS_DATA)
    model = DiffusionModule(MLPNet(**net_args), family="edm", lr=1e-3, ema_decay=0.995)
    net = copy.deepcopy(model.net)  # the plain loop's copy of the same initial weights
    if bare:
        model = _bare_module(model.net)
    dm.setup("fit")
    data = dm.train_data
    torch.manual_seed(1)
    denoiser = EDMFamily().precondition(net)
    params = list(denoiser.parameters())
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    loss_fn, batch = EDMFamily().loss(), QS_DATA["batch_size"]

    def plain_steps(k: int) -> None:
        for _ in range(k):
            y = data[torch.randint(0, len(data), (batch,))]
            loss = loss_fn(denoiser, y).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - 0.995)

    windows: List[dict] = []

    class Interleave(Callback):
        """A window = ``every`` Lightning steps (data loading, hooks, logging, EMA included) and,
        timed apart and excluded from them, ``every`` plain steps."""

        def __init__(self):
            self.t0 = self.c0 = None
            self.plain = self.plain_cpu = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch_, batch_idx):
            step = trainer.fit_loop.epoch_loop.total_batch_idx
            if step % every == 0:
                now, cnow = time.perf_counter(), time.process_time()
                if self.t0 is not None:
                    windows.append({"lightning": now - self.t0 - self.plain, "plain": self.plain,
                                    "lightning_cpu": cnow - self.c0 - self.plain_cpu, "plain_cpu": self.plain_cpu})
                self.t0, self.c0 = now, cnow

        def on_train_batch_end(self, trainer, pl_module, outputs, batch_, batch_idx):
            step = trainer.fit_loop.epoch_loop.total_batch_idx
            if (step + 1) % every == 0:
                t, c = time.perf_counter(), time.process_time()
                plain_steps(every)
                self.plain, self.plain_cpu = time.perf_counter() - t, time.process_time() - c

    with Peak() as peak:
        pl.Trainer(accelerator="cpu", devices=1, max_steps=every * (windows_n + 1) + 1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   limit_val_batches=0, default_root_dir=root, callbacks=[Interleave()]).fit(model, datamodule=dm)
    shutil.rmtree(root, ignore_errors=True)
    w = windows[1:]  # the first window warms both up
    best_l, best_p = min(x["lightning"] for x in w), min(x["plain"] for x in w)
    cpu_l, cpu_p = min(x["lightning_cpu"] for x in w), min(x["plain_cpu"] for x in w)
    speed, speed_cpu = best_p / best_l, cpu_p / cpu_l
    n_params = sum(p.numel() for p in params)
    what = "minimal LightningModule (plain loop's work)" if bare else "DiffusionModule"
    return {"measured": f"training step, Lightning {what}, MLPNet({net_args['hidden']} x {net_args['depth']}, "
                        f"{n_params / 1e6:.2f}M params)", "floor": "plain PyTorch loop (fused Adam, EMA)",
            "seconds": best_l / every, "floor_seconds": best_p / every, "ratio": 1 / speed, "ratio_cpu": 1 / speed_cpu,
            "cpu_seconds": cpu_l / every, "floor_cpu_seconds": cpu_p / every,
            "speed_vs_plain": speed, "speed_vs_plain_cpu": speed_cpu,
            "speed_vs_plain_paired_median": statistics.median(x["plain"] / x["lightning"] for x in w),
            "overhead_ms_per_step_cpu": (cpu_l - cpu_p) / every * 1e3,
            "goal": f"speed >= {GOALS['training']}", "meets_goal": _judge(speed, speed_cpu, ">="),
            "rounds": len(w), "peak_mb": peak.mb}


def section_training(args) -> dict:
    """Training throughput vs a plain loop: the quickstart net, and (full run) a 16x wider-compute
    one, which shows that the gap is a fixed per-step cost."""
    rows = [_training_case(QS_NET, 4 if args.quick else 12)]
    if not args.quick:
        rows.append(_training_case(QS_NET, 8, bare=True))  # how much of the gap is Lightning's loop
        rows.append(_training_case(dict(QS_NET, hidden=1024), 6))
    return {"config": {"batch": QS_DATA["batch_size"], "steps_per_window": 25}, "rows": rows}


# ----------------------------------------------------------------------------- section: quickstart
def _fit_subprocess(run_dir: Path, cache: Path, epochs: int, threads: int, extra=()) -> dict:
    """``python -m lightning_pfd fit`` of the embedded quickstart in ``run_dir``: wall time and max RSS."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SERVICE", "OMP_NUM_THREADS")}
    env.update(LIGHTNING_PFD_CACHE=str(cache), WANDB_MODE="offline", WANDB_SILENT="true",
               WANDB_DIR=str(run_dir), WANDB_CACHE_DIR=str(run_dir / "wandb_cache"),
               WANDB_CONFIG_DIR=str(run_dir / "wandb_config"), WANDB_DATA_DIR=str(run_dir / "wandb_data"))
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "lightning_pfd", "fit", "--threads", str(threads), "--trainer.max_epochs", str(epochs),
           *extra]
    t = time.perf_counter()
    hwm_kb = 0  # the python process's own high-water mark (ru_maxrss would be that of W&B's service)
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            hwm_kb = max(hwm_kb, _status_kb("VmHWM", proc.pid) or 0)
            time.sleep(0.1)
    seconds = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (run_dir / "log.txt").read_text()[-3000:]
        raise RuntimeError(f"quickstart failed ({proc.returncode}):\n{tail}")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": (hwm_kb or usage.ru_maxrss) / 1024}


def section_quickstart(args) -> dict:
    """The embedded quickstart as a user runs it (subprocess), with and without its callbacks, each
    with a cold cache (teacher data and references computed) and a warm one (read)."""
    epochs = 1 if args.quick else args.epochs
    base = Path(tempfile.mkdtemp(prefix="pfd_bench_qs_"))
    runs: Dict[str, List[dict]] = {}
    no_cb = ["--trainer.callbacks=[]"]
    for r in range(1 if args.quick else args.quickstart_rounds):
        measured, bare = base / f"cache{r}", base / f"bare_cache{r}"
        plan = [("cold", measured, []), ("warm", measured, []), ("no_callbacks_warm", measured, no_cb),
                ("no_callbacks_cold", bare, no_cb)]
        if r % 2:
            plan = plan[2:][::-1] + plan[:2]  # bare runs first (each cold before its warm)
        for name, cache, extra in plan:
            runs.setdefault(name, []).append(_fit_subprocess(base / f"{name}{r}", cache, epochs, args.threads, extra))
    shutil.rmtree(base, ignore_errors=True)
    best = {k: min(v, key=lambda x: x["seconds"]) for k, v in runs.items()}
    rows = []
    for name in ("cold", "warm"):
        b, f = best[name], best[f"no_callbacks_{name}"]
        rows.append({"measured": f"quickstart, {epochs} epochs, {name} cache", "floor": "same run without callbacks",
                     "seconds": b["seconds"], "floor_seconds": f["seconds"], "ratio": b["seconds"] / f["seconds"],
                     "ratio_cpu": b["cpu_seconds"] / f["cpu_seconds"],
                     "measuring_fraction": 1 - f["seconds"] / b["seconds"],
                     "measuring_fraction_cpu": 1 - f["cpu_seconds"] / b["cpu_seconds"],
                     "peak_mb": b["max_rss_mb"], "floor_peak_mb": f["max_rss_mb"], "rounds": len(runs[name])})
    return {"config": {"epochs": epochs, "threads": args.threads, "command": "python -m lightning_pfd fit "
                       f"--threads {args.threads} --trainer.max_epochs {epochs} (W&B offline, temp dirs; floor: "
                       "--trainer.callbacks=[])"}, "rows": rows, "runs": runs}


# ----------------------------------------------------------------------------- section: compile
def _compile_case(name: str, den, shape, m: int, batch: int, evaluations: int) -> dict:
    from lightning_pfd.diffusion.sampling import SamplerSettings

    torch._dynamo.reset()
    eager, comp = SamplerSettings(), SamplerSettings(compile=True)
    seeds = torch.arange(m)
    with Peak() as first:
        ref = comp.sample(den, seeds, shape, batch_size=batch)  # compile + one evaluation
    rec = Record()
    for i in range(evaluations):  # interleaved, order alternating
        pair = [("eager", eager), ("compiled", comp)]
        for label, s in (pair if i % 2 == 0 else pair[::-1]):
            out = rec.measure(label, s.sample, den, seeds, shape, batch_size=batch)
            if label == "eager":
                diff = float((out - ref).abs().max() / out.abs().max())
    per_eval = rec.best("compiled")
    saving = rec.best("eager") - per_eval
    return {"measured": f"{name}: compiled student sampling (M = {m}, batch {batch}, 35 NFE)",
            "floor": "eager sampling", "seconds": per_eval, "floor_seconds": rec.best("eager"),
            "ratio": per_eval / rec.best("eager"), "ratio_cpu": rec.best("compiled", "cpu_seconds") /
            rec.best("eager", "cpu_seconds"), "first_call_seconds": first.seconds,
            "compile_seconds": first.seconds - per_eval, "max_rel_diff_vs_eager": diff,
            "break_even_evaluations": (first.seconds - per_eval) / saving if saving > 0 else None,  # None: never
            "rounds": evaluations}


def section_compile(args) -> dict:
    """Compiled vs eager sampling of a student flow; the compile time is that of a first compile
    (a fresh, empty inductor cache: a later process would read its kernels from the cache)."""
    from lightning_pfd.diffusion import EDMFamily
    from lightning_pfd.nets import MLPNet, UNet

    inductor_cache = tempfile.mkdtemp(prefix="pfd_bench_inductor_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache
    torch.manual_seed(0)
    mlp = EDMFamily().precondition(MLPNet(**QS_NET)).eval()
    rows = [_compile_case("MLP (quickstart net)", mlp, (64,), 256, 256, 3 if args.quick else 6)]
    if not args.quick:
        unet = EDMFamily().precondition(UNet(img_resolution=16, in_channels=3, preset="unet1")).eval()
        rows.append(_compile_case("UNet unet1 at 3x16x16", unet, (3, 16, 16), 32, 32, 3))
    shutil.rmtree(inductor_cache, ignore_errors=True)
    return {"config": {"mode": "default", "backend": "inductor", "threads": args.threads,
                       "inductor_cache": "fresh (first compile)"}, "rows": rows}


# ----------------------------------------------------------------------------- section: memory
def predicted_empirical_reference_mb(m: int, n: int, d: int, batch: int, chunk: int, piece: int = 1024) -> dict:
    """The resident-memory bound of docs/performance.md for FlowEvaluation's empirical reference
    (mixed denoiser, identity descriptor, one process, no cache write), in MB:
    max(28 N D, 12 N D + 8 M D + 2 W) bytes with W = 128 B D + 8 B max(chunk, piece)."""
    mb = 2.0**-20
    data = 12 * n * d  # float64 data + float32 centred copy, kept
    init = 28 * n * d  # while built: float64 data, centred copy, its square, a finiteness mask (+ allocator slack)
    endpoints = 8 * m * d  # the preallocated float64 endpoints (identity features are a view of them)
    work = 128 * batch * d + 8 * batch * max(chunk, piece)  # ~16 float64 (B, D) buffers + one (B, chunk) block
    return {"data_mb": data * mb, "init_mb": init * mb, "endpoints_mb": endpoints * mb, "batch_mb": work * mb,
            "allocator_slack_mb": work * mb, "bound_mb": max(init, data + endpoints + 2 * work) * mb}


def section_memory(args) -> dict:
    import bench_empirical as be

    from lightning_pfd.diffusion.sampling import SamplerSettings
    from lightning_pfd.evaluation.flow import FlowEvaluation

    m, n, side = args.mem_size
    shape = (3, side, side)
    d = 3 * side * side
    train = be.smooth_images(n, shape, seed=0).to(torch.float32)
    batch, chunk = 256, 4096
    ev = FlowEvaluation(train, num_eval=m, settings=SamplerSettings(), batch_size=batch, chunk_size=chunk,
                        use_cache=False, default_metrics=False)
    with Peak() as peak:
        refs = ev.compute_references()
    ends = refs["empirical"].endpoints
    nearest = torch.cdist(ends.reshape(m, -1)[:64], train.reshape(n, -1).double()).min(1).values
    pred = predicted_empirical_reference_mb(m, n, d, batch, chunk)
    return {"config": {"M": m, "N": n, "D": d, "batch": batch, "chunk": chunk, "threads": args.threads},
            "rows": [{"measured": f"empirical reference, M = {m}, N = {n}, D = {d} (mixed denoiser)",
                      "floor": "bound of docs/performance.md", "seconds": peak.seconds, "peak_mb": peak.mb,
                      "ratio": None if peak.mb is None else peak.mb / pred["bound_mb"], "goal": "<= 1",
                      "bound_mb": pred["bound_mb"], "within_bound": peak.mb is not None and peak.mb <= pred["bound_mb"],
                      "meets_goal": peak.mb is not None and peak.mb <= pred["bound_mb"],
                      "predicted": pred, "gflop": NFE * 4 * m * n * d / 1e9,
                      "gflops_rate": NFE * 4 * m * n * d / 1e9 / peak.seconds,
                      "endpoint_to_nearest_training_point_max": float(nearest.max())}]}


# ----------------------------------------------------------------------------- section: budget
#: assumed GPU for the paper-scale estimates: H100 SXM dense rates (TFLOP/s) and the fraction of
#: them a U-Net reaches in training and in batched sampling alike (so time fractions = FLOP fractions)
GPU = {"name": "H100 SXM", "bf16": 989.0, "tf32": 495.0, "fp64": 67.0, "utilization": 0.4}
#: the shipped configs, from their YAML files: data sizes, steps, validation and monitor arguments
BUDGET_CONFIGS = {
    # as shipped: M = 1024 evaluation seeds, 8 validation batches of 128 (the paper's M = 10^4 would
    # make every evaluation 10x dearer: see "largest M for <= 20 % with log" in the detail line)
    "distill_vp_cifar10": dict(yaml="lightning_pfd/configs/distill_vp_cifar10.yaml", shape=(3, 32, 32), n_train=4096,
                               batch=128, epochs=500, val_per_epoch=8 * 128, teacher_preset="unet10",
                               monitors={"generalization": dict(num_eval=1024, num_loss_samples=1024)}),
    "edm_cifar10": dict(yaml="lightning_pfd/configs/edm_cifar10.yaml", shape=(3, 32, 32), n_train=50000, batch=128,
                        epochs=400000 * 128 // 50000, val_per_epoch=10000, monitors={}),
    "icr_unet_large": dict(yaml="lightning_pfd/configs/experiments/icr_unet_large.yaml", shape=(1, 16, 16),
                           n_train=1024, batch=64, steps_per_epoch=75, epochs=20, val_per_epoch=64,
                           monitors={"icr": dict(pairs=1024), "memorization": dict(num_samples=64)}),
}


def _net_flops(net_args: dict, shape) -> dict:
    """Forward, forward + backward and forward-to-the-default-tap FLOPs per sample (FlopCounterMode)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_pfd.diffusion import EDMFamily
    from lightning_pfd.diffusion.features import tap_features
    from lightning_pfd.nets import UNet

    den = EDMFamily().precondition(UNet(**net_args)).eval()
    x, sig = torch.randn(2, *shape), torch.tensor(1.0)
    out = {}
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        den(x, sig)
    out["forward"] = fc.get_total_flops() / 2
    with FlopCounterMode(display=False) as fc:
        den(x, sig).square().sum().backward()
    out["train"] = fc.get_total_flops() / 2
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        tap_features(den.net, *den.network_input(x, 0.29), None)
    out["tap"] = fc.get_total_flops() / 2
    out["params"] = sum(p.numel() for p in den.parameters())
    return out


def _budget_rows(name: str, cfg: dict) -> dict:
    import yaml

    from lightning_pfd.callbacks.schedule import log_schedule

    y = yaml.safe_load((ROOT / cfg["yaml"]).read_text())
    net_args = dict(y["model"]["init_args"]["net"]["init_args"])
    f = _net_flops(net_args, cfg["shape"])
    d = math.prod(cfg["shape"])
    steps = cfg.get("steps_per_epoch") or math.ceil(cfg["n_train"] / cfg["batch"])
    train = steps * cfg["batch"] * f["train"]  # per epoch
    val = cfg["val_per_epoch"] * f["forward"]  # Lightning's frozen-noise val/loss, every epoch
    per_measure, once = {}, {}
    for mon, a in cfg["monitors"].items():
        if mon == "generalization":
            m = a["num_eval"]
            per_measure[mon] = m * NFE * f["forward"] + 2 * a["num_loss_samples"] * f["forward"]
            teacher = _net_flops(dict(preset=cfg["teacher_preset"], img_resolution=cfg["shape"][1],
                                      in_channels=cfg["shape"][0]), cfg["shape"])["forward"]
            once["teacher_flow"] = m * NFE * teacher
            once["empirical_flow"] = NFE * 4 * m * cfg["n_train"] * d
        elif mon == "icr":
            per_measure[mon] = 2 * a["pairs"] * f["tap"]
        elif mon == "memorization":
            per_measure[mon] = a["num_samples"] * (NFE * f["forward"] + 2 * cfg["n_train"] * d)
    measure = sum(per_measure.values())
    epochs = cfg["epochs"]
    rate = GPU["bf16"] * 1e12 * GPU["utilization"]

    def fraction(n_measured: int, measure_flops: float, val_flops: float) -> float:
        cost = n_measured * measure_flops + epochs * val_flops
        return cost / (cost + epochs * train)

    log_passes = len(log_schedule(epochs))
    rows = {"name": name, "epochs": epochs, "params": f["params"], "forward_gflop": f["forward"] / 1e9,
            "train_gflop_per_sample": f["train"] / 1e9, "train_pflop_per_epoch": train / 1e15,
            "val_pflop_per_epoch": val / 1e15, "measure_pflop": {k: v / 1e15 for k, v in per_measure.items()},
            "measure_over_train_epoch": measure / train if measure else 0.0,
            "once_pflop": {k: v / 1e15 for k, v in once.items()},
            "gpu_hours_training": epochs * train / rate / 3600, "log_passes": log_passes,
            "fraction": {"every epoch": fraction(epochs, measure, val) if measure else fraction(0, 0, val),
                         "log": fraction(log_passes, measure, val),
                         "log, val loop limited to 1024 samples": fraction(
                             log_passes, measure, min(cfg["val_per_epoch"], 1024) * f["forward"])}}
    if measure:
        for k, v in rows["fraction"].items():
            rows[f"gpu_hours_measuring[{k}]"] = v / (1 - v) * rows["gpu_hours_training"]
        # measuring <= 20 % of the run = <= 1/4 of training; the val loop limited to 1024 samples
        budget = 0.25 * epochs * train - epochs * min(cfg["val_per_epoch"], 1024) * f["forward"]
        rows["max_measurements_for_20pct"] = budget / measure
        if "generalization" in per_measure:  # the largest M with the log schedule and a limited val loop
            a = cfg["monitors"]["generalization"]
            other = measure - per_measure["generalization"]
            per_m = NFE * f["forward"]
            m_max = (budget / log_passes - other - 2 * a["num_loss_samples"] * f["forward"]) / per_m
            rows["max_num_eval_log_20pct"] = m_max
    return rows


def section_budget(args) -> dict:
    """Fraction of a paper-scale run spent measuring, from FLOP counts (module docstring of
    docs/performance.md): every epoch as shipped, with the ``log`` schedule, and with the
    validation loop limited; FLOPs of the nets counted by torch's FlopCounterMode."""
    rows = []
    for name, cfg in BUDGET_CONFIGS.items():
        r = _budget_rows(name, cfg)
        rows.append({"measured": f"{name}: measuring / run (every epoch, log, log + val <= 1024)",
                     "floor": "FLOP count", "fractions": r["fraction"], "detail": r,
                     "ratio": r["fraction"]["log"], "goal": "<= 0.2 (log)",
                     "meets_goal": r["fraction"]["log"] <= 0.2})
    return {"config": {"gpu": GPU, "nfe": NFE}, "rows": rows}


# ----------------------------------------------------------------------------- output
def machine() -> dict:
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    own = {"benchmarks/results.json", "benchmarks/results.md", "benchmarks/results_gpu.json", "benchmarks/results_gpu.md"}
    dirty = "\n".join(l for l in git("status", "--porcelain", "--untracked-files=no").splitlines()
                      if l.split(maxsplit=1)[-1] not in own)  # the tables this script writes do not count
    return {"commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty and dirty != "unknown" else ""),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu, "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _fmt(v, spec=".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    return format(v, spec)


def markdown(results: dict) -> str:
    lines = ["# lightning_pfd benchmark table", "",
             "`python benchmarks/run.py` (benchmarks/run.py explains every row). Times are the best of the "
             "interleaved rounds; ratio = time / floor (wall clock; `cpu`: process CPU time). With one thread the "
             "goals are judged on the CPU-time ratio (the work done; wall time adds waits for a core held by "
             "other processes on a shared machine). Peak = increase of the resident set during one call.", ""]
    for name in ALL_SECTIONS:
        if name not in results:
            continue
        sec = results[name]
        meta = sec["meta"]
        load = meta.get("load_average")
        lines += [f"## {name}", "",
                  f"commit `{meta['commit']}`, {meta['date']}, {meta['threads']} thread(s), {meta['cpu']} "
                  f"({meta['cores']} cores), torch {meta['torch']}, load average "
                  f"{' / '.join(f'{x:.1f}' for x in load) if load else '-'} (1/5/15 min) at the start"
                  + (", `--quick`" if meta.get("quick") else ""), ""]
        lines += ["| measured | floor | time (s) | floor (s) | ratio | ratio (cpu) | goal | met | peak MB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sec["rows"]:
            lines.append(f"| {r['measured']} | {r['floor']} | {_fmt(r.get('seconds'))} "
                         f"| {_fmt(r.get('floor_seconds'))} "
                         f"| {_fmt(r.get('ratio'))} | {_fmt(r.get('ratio_cpu'))} | {r.get('goal', '-')} "
                         f"| {_fmt(r.get('meets_goal'))} | {_fmt(r.get('peak_mb'), '.0f')} |")
        extra = [f"- {r['measured']}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r.items() if k in (
            "speed_vs_plain", "speed_vs_plain_cpu", "speed_vs_plain_paired_median", "overhead_ms_per_step_cpu",
            "measuring_fraction", "measuring_fraction_cpu",
            "compile_seconds", "break_even_evaluations", "max_rel_diff_vs_eager", "bound_mb", "within_bound",
            "gflops_rate", "all_within_1e-9", "ratio_paired_median"))
            for r in sec["rows"] if any(k in r for k in ("speed_vs_plain", "measuring_fraction", "compile_seconds",
                                                          "bound_mb", "all_within_1e-9", "ratio_paired_median"))]
        extra += [f"- {r['measured'].split(':')[0]}: " + ", ".join(f"{k}: {v:.1%}" for k, v in r["fractions"].items())
                  + (f"; largest M for <= 20 % with log: {r['detail']['max_num_eval_log_20pct']:.0f}"
                     if "max_num_eval_log_20pct" in r.get("detail", {}) else "")
                  for r in sec["rows"] if "fractions" in r]
        lines += [""] + extra + [""] if extra else [""]
    return "\n".join(lines)


SECTION_FUNCS = {"empirical": section_empirical, "monitors": section_monitors, "per_unit": section_per_unit,
                 "training": section_training,
                 "quickstart": section_quickstart, "compile": section_compile, "memory": section_memory,
                 "budget": section_budget}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and few rounds (~3 min)")
    ap.add_argument("--sections", nargs="+", choices=ALL_SECTIONS, default=list(DEFAULT_SECTIONS))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: a shared machine)")
    ap.add_argument("--epochs", type=int, default=4, help="quickstart epochs in the quickstart section")
    ap.add_argument("--quickstart-rounds", type=int, default=1, help="rounds of the 4 quickstart runs")
    ap.add_argument("--mem-size", type=int, nargs=3, default=[4096, 4096, 32], metavar=("M", "N", "SIDE"),
                    help="memory section: M seeds, N training images of 3 x SIDE x SIDE")
    ap.add_argument("--out", type=Path, default=RESULTS_JSON, help="results JSON (the .md is written beside it)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    JUDGE["on_cpu"] = args.threads == 1
    cache = tempfile.mkdtemp(prefix="pfd_bench_cache_")
    os.environ["LIGHTNING_PFD_CACHE"] = cache  # never the user's cache: cold means cold
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    t_all = time.perf_counter()
    try:
        for name in args.sections:
            meta = {**machine(), "threads": args.threads, "quick": args.quick}
            t = time.perf_counter()
            print(f"[run.py] {name} ...", flush=True)
            out = SECTION_FUNCS[name](args)
            meta["section_seconds"] = time.perf_counter() - t
            results[name] = {"meta": meta, **out}
            for r in out["rows"]:
                print(f"  {r['measured']} vs {r['floor']}: ratio {_fmt(r.get('ratio'))}", flush=True)
            args.out.write_text(json.dumps(results, indent=1, default=float))
            args.out.with_suffix(".md").write_text(markdown(results))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"[run.py] {time.perf_counter() - t_all:.0f} s; wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
