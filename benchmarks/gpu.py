"""GPU checks and timings: what benchmarks/run.py cannot measure on a CPU-only machine.

    python benchmarks/gpu.py                     # all sections, ~8 min on one H100
    python benchmarks/gpu.py --sections env empirical --out /tmp/gpu.json

Sections (each independent; a failing section is recorded with its error, the others still run):

* ``env``: device, torch version, and the device's measured matmul rates (float64, IEEE float32,
  TF32, bf16; n x n x n products, median of timed repeats after warm-up, random data).
* ``empirical``: the mixed-precision ``EmpiricalDenoiser`` on CUDA. Correctness: along a Heun-18
  PF-ODE (35 calls, every sigma of the EDM grid incl. 0.002) and on adversarial near-ties at
  sigma = 0.002 and 0.02, the result is compared with a brute-force float64 softmax computed here
  (direct ||x - y||^2, logsumexp), with the caller's TF32 switches ON (the denoiser must override
  them where its error bound assumes IEEE float32). Speed: the 35 calls timed (CUDA events after
  synchronisation, interleaved, best of repeats) for ``mixed``, ``float64`` and the bare matmul
  floors of the same shapes in float64, IEEE float32 and TF32.
* ``flow``: ``FlowEvaluation.evaluate`` (E_mem against the empirical reference, M seeds, Heun-18)
  for the quickstart MLP and the ``unet1`` preset on CIFAR-shaped data: eager fp32, eager bf16
  autocast, ``compile: default`` and ``compile: reduce-overhead`` (CUDA graphs): compile time,
  per-measure time after warm-up, recompilations on a second measure after a weight update, and
  the largest endpoint difference to eager fp32.
* ``fit``: ``python -m lightning_pfd fit`` on the embedded quickstart on the GPU (accelerator
  auto), 3 epochs uninterrupted vs 2 epochs + resume from ``last.ckpt`` to 3: the logged metrics of
  epoch 2 compared; and one run with ``--trainer.precision bf16-mixed``.

Writes a JSON file (``--out``, default benchmarks/results_gpu.json) and a markdown summary beside
it; the summary is printed last.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

SECTIONS = ("env", "empirical", "flow", "fit", "configs", "sample_compile")
#: the shipped configs whose data exist offline (CIFAR-10 ones need the dataset on disk)
OFFLINE_CONFIGS = ("quickstart", "teacher_edm_digits", "distill_vp_digits", "sbm_precip", "lim_precip",
                   "experiments/icr_unet_small", "experiments/icr_unet_large", "experiments/double_descent",
                   "experiments/pite_sbm", "experiments/pite_lim")


def _sync():
    torch.cuda.synchronize()


def _time_cuda(fn, repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` (synchronised before and after each call)."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        _sync()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


class _tf32:
    """Set the caller-side float32 matmul mode ('ieee' or 'tf32') for the duration."""

    def __init__(self, mode: str):
        self.mode = mode

    def __enter__(self):
        m = torch.backends.cuda.matmul
        if hasattr(m, "fp32_precision"):
            self.old = ("fp32_precision", m.fp32_precision)
            m.fp32_precision = self.mode
        else:
            self.old = ("allow_tf32", m.allow_tf32)
            m.allow_tf32 = self.mode == "tf32"
        return self

    def __exit__(self, *exc):
        setattr(torch.backends.cuda.matmul, *self.old)


# ----------------------------------------------------------------------------- env
def section_env(args) -> dict:
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "cuda": torch.version.cuda, "multiprocessors": props.multi_processor_count,
           "memory_gib": props.total_memory / 2**30, "rates_tflops": {}}
    n = args.matmul_n
    for name, dtype, mode in (("float64", torch.float64, "ieee"), ("float32_ieee", torch.float32, "ieee"),
                              ("tf32", torch.float32, "tf32"), ("bf16", torch.bfloat16, "ieee")):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        with _tf32(mode):
            t = _time_cuda(lambda: a @ b, repeats=10, warmup=3)
        out["rates_tflops"][name] = 2 * n ** 3 / t / 1e12
    return out


# ----------------------------------------------------------------------------- empirical
def _brute_force(data64: torch.Tensor, x: torch.Tensor, sigma: float) -> torch.Tensor:
    """D*(x; sigma) = sum_i softmax_i(-||x - y_i||^2 / (2 sigma^2)) y_i, float64, direct distances."""
    out = []
    flat = x.reshape(x.shape[0], -1)
    for s in range(0, flat.shape[0], 16):
        d2 = (flat[s:s + 16, None, :] - data64[None, :, :]).square().sum(-1)  # exact differences
        out.append(torch.softmax(-d2 / (2 * sigma ** 2), dim=1) @ data64)
    return torch.cat(out).reshape(x.shape)


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / (1 + |ref|): the tests' criterion |diff| <= 1e-9 + 1e-9 |ref|."""
    return float(((got - ref).abs() / (1 + ref.abs())).max())


def _near_ties(data64: torch.Tensor, m: int, gen: torch.Generator) -> torch.Tensor:
    """Points midway between two training points (plus a 1e-12 nudge): two log-weights tie."""
    n = data64.shape[0]
    i = torch.randint(0, n, (m,), generator=gen)
    j = (i + 1 + torch.randint(0, n - 1, (m,), generator=gen)) % n
    mid = 0.5 * (data64[i.to(data64.device)] + data64[j.to(data64.device)])
    return mid + 1e-12 * torch.randn(mid.shape, generator=gen, dtype=torch.float64).to(mid.device)


def _longdouble(data64: torch.Tensor, x: torch.Tensor, sigma: float) -> torch.Tensor:
    """D* from 80-bit extended-precision distances (numpy longdouble, on the CPU): the reference
    for near-ties, where float64 rounding of ||x - y||^2 is amplified by 1 / (2 sigma^2)."""
    import numpy as np

    Y = data64.reshape(len(data64), -1).cpu().numpy().astype(np.longdouble)
    out = []
    for r in x.reshape(len(x), -1).cpu().numpy().astype(np.longdouble):
        logw = -((r[None] - Y) ** 2).sum(1) / (2 * np.longdouble(sigma) ** 2)
        w = np.exp(logw - logw.max())
        out.append((w[:, None] * Y).sum(0) / w.sum())
    return torch.tensor(np.array(out, dtype=np.float64)).reshape(x.shape).to(x.device)


def section_empirical(args) -> dict:
    from bench_empirical import record_calls, smooth_images
    from lightning_pfd.diffusion import EmpiricalDenoiser
    from lightning_pfd.diffusion.empirical import float64_matmul_is_fast

    dev = torch.device("cuda")
    n, shape, m = args.emp_n, (3, 32, 32), args.emp_m
    data = smooth_images(n, shape, seed=0).to(dev)
    y64 = data.reshape(n, -1)
    out = {"config": {"n": n, "shape": list(shape), "m": m, "nfe": 35},
           "float64_matmul_is_fast": float64_matmul_is_fast(dev)}
    mixed = EmpiricalDenoiser(data)  # the default: dispatches on float64_matmul_is_fast
    search = EmpiricalDenoiser(data)
    search.float64_fast = False  # the float32 candidate search forced (as on a consumer GPU)
    exact = EmpiricalDenoiser(data, precision="float64")
    with _tf32("tf32"):  # the caller allows TF32 everywhere: the denoiser must stay exact
        calls = [(x.to(dev), s) for x, s in record_calls(exact, args.emp_check_m, shape)]
        worst, modes = {"search": 0.0, "float64": 0.0}, {}
        for x, s in calls:
            ref = _brute_force(y64, x, s)
            worst["search"] = max(worst["search"], _err(search(x, s), ref))
            modes[search.last_stats.get("mode", "?")] = modes.get(search.last_stats.get("mode", "?"), 0) + 1
            worst["float64"] = max(worst["float64"], _err(exact(x, s), ref))
        out["heun_calls_max_err_vs_bruteforce"] = worst
        out["search_fp32_modes"] = modes
        gen = torch.Generator().manual_seed(3)
        ties = {}
        for s in (0.002, 0.02):
            x = _near_ties(y64, args.emp_ties, gen).reshape(args.emp_ties, *shape)
            ref = _longdouble(y64, x, s)
            ties[str(s)] = {"search": _err(search(x, s), ref), "float64": _err(exact(x, s), ref),
                            "bruteforce_float64": _err(_brute_force(y64, x, s), ref)}
        out["near_ties_err_vs_longdouble"] = ties
    out["heun_within_1e-9"] = bool(max(worst.values()) <= 1e-9)

    # speed at the benchmark size
    calls = [(x.to(dev), s) for x, s in record_calls(exact, m, shape)]
    d = y64.shape[1]
    g = torch.Generator(device=dev).manual_seed(1)
    a32 = torch.randn(m, d, generator=g, device=dev)
    p32 = torch.rand(m, n, generator=g, device=dev)
    y32 = y64.float()
    a64, p64 = a32.double(), p32.double()

    def floor32():
        return a32 @ y32.T, p32 @ y32

    def floor64():
        return a64 @ y64.T, p64 @ y64

    variants = {"mixed (default)": lambda x, s: mixed(x, s), "mixed, float32 search forced": lambda x, s: search(x, s),
                "float64": lambda x, s: exact(x, s), "floor float32 (IEEE)": lambda x, s: floor32(),
                "floor float64": lambda x, s: floor64(), "floor TF32": None}
    tot = {k: 0.0 for k in variants}
    per_sigma = []
    for x, s in calls:
        row = {"sigma": s}
        for k, fn in variants.items():
            if fn is None:
                with _tf32("tf32"):
                    t = _time_cuda(floor32, repeats=args.repeats, warmup=1)
            else:
                with _tf32("ieee"):
                    t = _time_cuda(lambda: fn(x, s), repeats=args.repeats, warmup=1)
            row[k] = t
            tot[k] += t
        search(x, s)
        st = search.last_stats
        row["search_dense_rows"] = st.get("dense_rows", 0) / max(st.get("rows", 1), 1)
        row["search_mode"] = st.get("mode", "?")
        per_sigma.append(row)
    out["seconds_35_calls"] = tot
    out["ratios"] = {k: v / tot["floor float32 (IEEE)"] for k, v in tot.items()}
    out["ratios_to_float64_floor"] = {k: v / tot["floor float64"] for k, v in tot.items()}
    out["per_sigma"] = per_sigma
    flop = 35 * 4 * m * n * d
    out["flop_35_calls"] = flop
    out["achieved_tflops"] = {k: flop / v / 1e12 for k, v in tot.items()}
    return out


# ----------------------------------------------------------------------------- flow
def _student(kind: str, dev):
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet, UNet

    torch.manual_seed(0)
    if kind == "mlp":
        net, shape = MLPNet(64, hidden=256, depth=4), (64,)
    else:
        net, shape = UNet(preset="unet1", img_resolution=32, in_channels=3), (3, 32, 32)
    mod = DiffusionModule(net).to(dev).eval()
    return mod, shape


def _dynamo_frames() -> int:
    """Graphs dynamo has compiled so far in this process (grows on every (re)compilation)."""
    import torch._dynamo.utils as du
    return int(du.counters["stats"].get("unique_graphs", 0))


def section_flow(args) -> dict:
    import torch._dynamo
    from bench_empirical import smooth_images
    from lightning_pfd.diffusion.sampling import SamplerSettings
    from lightning_pfd.evaluation.flow import FlowEvaluation

    dev = torch.device("cuda")
    out = {}
    for kind in ("mlp", "unet1"):
        mod, shape = _student(kind, dev)
        n, m = (1024, args.flow_m_mlp) if kind == "mlp" else (4096, args.flow_m_unet)
        train = (smooth_images(n, shape, seed=0) if len(shape) == 3
                 else torch.tanh(torch.randn(n, *shape, generator=torch.Generator().manual_seed(0),
                                             dtype=torch.float64)))
        res = {"n_train": n, "m": m, "params": sum(p.numel() for p in mod.parameters())}
        ref_end = None
        for name, kw in (("eager_fp32", {}), ("eager_bf16", {"precision": "bf16"}),
                         ("compile_default", {"compile": True}),
                         ("compile_reduce_overhead", {"compile": "reduce-overhead"})):
            torch._dynamo.reset()
            try:
                ev = FlowEvaluation(train.to(dev), num_eval=m, settings=SamplerSettings(**kw), batch_size=args.flow_batch,
                                    use_cache=False, num_loss_samples=None)
                ev.compute_references(dev)  # the reference (empirical) flow: not the student's cost
                _sync()
                t0 = time.perf_counter()
                r1 = ev.evaluate(mod.denoiser)
                _sync()
                first = time.perf_counter() - t0
                with torch.no_grad():  # an epoch's weight update, in place
                    for p in mod.parameters():
                        p.mul_(1.0 + 1e-4)
                frames0 = _dynamo_frames()
                _sync()
                t0 = time.perf_counter()
                ev.evaluate(mod.denoiser)
                _sync()
                second = time.perf_counter() - t0
                frames = _dynamo_frames() - frames0
                with torch.no_grad():
                    for p in mod.parameters():
                        p.div_(1.0 + 1e-4)
                t0 = time.perf_counter()
                r3 = ev.evaluate(mod.denoiser)
                _sync()
                third = time.perf_counter() - t0
                end = r3.student.double().cpu()
                if ref_end is None:
                    ref_end = r1.student.double().cpu()
                diff = float((end - ref_end).abs().max() / ref_end.abs().max())
                res[name] = {"first_measure_s": first, "measure_s": min(second, third),
                             "dynamo_frames_on_second_measure": frames,
                             "e_mem": float(r3.metrics["e_mem"]),
                             "max_rel_endpoint_diff_vs_eager_fp32": diff}
            except Exception as e:  # recorded, the other variants still run
                res[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        out[kind] = res
    return out


# ----------------------------------------------------------------------------- fit
def _fit(workdir: Path, name: str, extra: list, env: dict, config: str = "quickstart") -> dict:
    """``fit`` of an embedded config in ``workdir/name`` (its runs/<config> lands there)."""
    cmd = [sys.executable, "-m", "lightning_pfd", "fit", "--config", config,
           "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
           "--trainer.logger.save_dir", "runs/csv"] + extra
    (workdir / name).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=workdir / name, env=env, capture_output=True, text=True)
    return {"cmd": " ".join(cmd[2:]), "rc": p.returncode, "seconds": time.perf_counter() - t0,
            "tail": (p.stdout + p.stderr)[-3000:]}


def _metrics(workdir: Path, name: str) -> dict:
    files = sorted((workdir / name).rglob("metrics.csv"))
    rows = []
    for f in files:
        with open(f) as fh:
            rows += list(csv.DictReader(fh))
    out = {}
    for r in rows:
        for k, v in r.items():
            if v not in ("", None) and k not in ("step",):
                out.setdefault(k, {})[r.get("epoch")] = float(v)
    return out


def section_fit(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpu_fit_"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               WANDB_MODE="disabled", LIGHTNING_PFD_CACHE=str(work / "cache"))
    out = {"workdir": str(work)}
    extra = shlex.split(args.fit_extra)
    base = ["--trainer.max_epochs", "3"] + extra
    out["full"] = _fit(work, "full", base, env)
    out["part"] = _fit(work, "part", ["--trainer.max_epochs", "2"] + extra, env)
    ckpts = sorted((work / "part").rglob("last.ckpt"))
    out["resume_ckpt"] = str(ckpts[0]) if ckpts else None
    if ckpts:
        out["resume"] = _fit(work, "part", base + ["--ckpt_path", str(ckpts[0].resolve())], env)
    out["bf16"] = _fit(work, "bf16", ["--trainer.max_epochs", "1", "--trainer.precision", "bf16-mixed"] + extra, env)
    full, part = _metrics(work, "full"), _metrics(work, "part")
    cmp = {}
    for k, by_epoch in full.items():
        if "2" in by_epoch and k in part and "2" in part[k]:
            a, b = by_epoch["2"], part[k]["2"]
            cmp[k] = {"uninterrupted": a, "resumed": b, "abs_diff": abs(a - b)}
    out["epoch2_metrics_uninterrupted_vs_resumed"] = cmp
    out["bf16_metrics"] = {k: v for k, v in _metrics(work, "bf16").items()}
    return out


def section_configs(args) -> dict:
    """Every offline shipped config for one short epoch on the GPU (device-agnostic code paths:
    EDM, VP, Levy-Ito, the U-Nets, every monitor): exit code, logged keys, non-finite values."""
    work = Path(tempfile.mkdtemp(prefix="gpu_cfg_"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               WANDB_MODE="disabled", LIGHTNING_PFD_CACHE=str(work / "cache"))
    out = dict(args.previous_configs)  # --configs reruns a subset; the others keep their entries
    for cfg in args.configs:
        name = cfg.replace("/", "_")
        short = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", str(args.config_batches),
                 "--trainer.limit_val_batches", "2"]
        if cfg == "distill_vp_digits":  # distils the teacher that teacher_edm_digits trained just before
            short += ["--data.init_args.teacher_ckpt",
                      str(work / "teacher_edm_digits" / "runs" / "teacher_edm_digits" / "checkpoints" / "last.ckpt")]
        r = _fit(work, name, short, env, config=cfg)
        logged = _metrics(work, name)
        bad = sorted(k for k, v in logged.items() if any(x != x or abs(x) == float("inf") for x in v.values()))
        out[cfg] = {"rc": r["rc"], "seconds": r["seconds"], "logged_keys": len(logged),
                    "nonfinite_keys": bad, **({"tail": r["tail"]} if r["rc"] else {})}
    return out


def section_sample_compile(args) -> dict:
    """``model.init_args.sample_compile: reduce-overhead`` in a real fit on the GPU: the monitors
    that sample through ``generate`` (MemorizationMonitor: quickstart; TailMonitor with the
    Levy-Ito module: lim_precip) run compiled with CUDA graphs; their logged values against the same
    run eager (equal up to float32 rounding of the compiled kernels)."""
    work = Path(tempfile.mkdtemp(prefix="gpu_sc_"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               WANDB_MODE="disabled", LIGHTNING_PFD_CACHE=str(work / "cache"))
    out = {}
    for cfg in ("quickstart", "lim_precip"):
        short = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", str(args.config_batches),
                 "--trainer.limit_val_batches", "2"]
        runs = {}
        for mode in ("eager", "reduce-overhead"):
            extra = short + ([] if mode == "eager" else ["--model.init_args.sample_compile", mode])
            name = f"{cfg}_{mode}"
            r = _fit(work, name, extra, env, config=cfg)
            runs[mode] = {"rc": r["rc"], "seconds": r["seconds"], "metrics": _metrics(work, name),
                          **({"tail": r["tail"]} if r["rc"] else {})}
        keys = sorted(set(runs["eager"]["metrics"]) & set(runs["reduce-overhead"]["metrics"]))
        diffs = {}
        for k in keys:
            if k.startswith(("mem/", "tail/", "pfd/")):
                a, b = runs["eager"]["metrics"][k], runs["reduce-overhead"]["metrics"][k]
                common = sorted(set(a) & set(b))
                if common:
                    diffs[k] = max(abs(a[e] - b[e]) / max(abs(a[e]), 1e-12) for e in common)
        out[cfg] = {"rc": {m: v["rc"] for m, v in runs.items()},
                    "seconds": {m: v["seconds"] for m, v in runs.items()},
                    "max_rel_diff_compiled_vs_eager": diffs,
                    **{f"tail_{m}": v["tail"] for m, v in runs.items() if "tail" in v}}
    return out


# ----------------------------------------------------------------------------- main
def _markdown(res: dict) -> str:
    lines = ["# GPU checks and timings (`python benchmarks/gpu.py`)", "",
             f"{res['meta']['date']}, commit `{res['meta']['commit']}`", ""]
    env = res.get("env", {})
    if "rates_tflops" in env:
        lines += [f"Device: {env['device']} ({env['multiprocessors']} SMs, {env['memory_gib']:.0f} GiB), "
                  f"torch {env['torch']}, CUDA {env['cuda']}", "",
                  "| matmul | TFLOP/s |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in env["rates_tflops"].items()] + [""]
    emp = res.get("empirical", {})
    if "seconds_35_calls" in emp:
        c = emp["config"]
        lines += [f"## EmpiricalDenoiser on CUDA (N = {c['n']}, D = 3x32x32, M = {c['m']}, 35 Heun-18 calls)", "",
                  f"- float64 matmuls fast on this device: {emp['float64_matmul_is_fast']} (then the default "
                  "`mixed` runs the float64 algorithm)",
                  f"- exactness with the caller's TF32 on, max |D - ref| / (1 + |ref|) on the Heun calls vs a "
                  f"float64 brute force: {emp['heun_calls_max_err_vs_bruteforce']}; float32-pass modes of the "
                  f"forced search {emp['search_fp32_modes']}",
                  f"- near-ties vs an 80-bit reference: {emp['near_ties_err_vs_longdouble']}",
                  "", "| variant | seconds (35 calls) | / float32 floor | / float64 floor | TFLOP/s (dense-equivalent) |",
                  "|---|---|---|---|---|"]
        for k, v in emp["seconds_35_calls"].items():
            lines.append(f"| {k} | {v:.4f} | {emp['ratios'][k]:.2f} | {emp['ratios_to_float64_floor'][k]:.2f} | "
                         f"{emp['achieved_tflops'][k]:.1f} |")
        lines.append("")
    flow = res.get("flow", {})
    for kind, r in flow.items():
        if not isinstance(r, dict) or "m" not in r:
            continue
        lines += [f"## FlowEvaluation.evaluate, {kind} ({r['params']:,} params, M = {r['m']})", "",
                  "| variant | first measure (s) | measure (s) | dynamo frames on 2nd | max rel endpoint diff vs eager fp32 |",
                  "|---|---|---|---|---|"]
        for name, v in r.items():
            if isinstance(v, dict) and "measure_s" in v:
                lines.append(f"| {name} | {v['first_measure_s']:.2f} | {v['measure_s']:.3f} | "
                             f"{v['dynamo_frames_on_second_measure']} | {v['max_rel_endpoint_diff_vs_eager_fp32']:.1e} |")
            elif isinstance(v, dict) and "error" in v:
                lines.append(f"| {name} | error: {v['error'][:200]} | | | |")
        lines.append("")
    fit = res.get("fit", {})
    if "full" in fit:
        lines += ["## fit on the GPU (quickstart)", ""]
        for k in ("full", "part", "resume", "bf16"):
            if k in fit:
                lines.append(f"- {k}: rc {fit[k]['rc']}, {fit[k]['seconds']:.0f} s")
        cmp = fit.get("epoch2_metrics_uninterrupted_vs_resumed", {})
        if cmp:
            worst = max(cmp.items(), key=lambda kv: kv[1]["abs_diff"])
            lines.append(f"- epoch-2 metrics, uninterrupted vs resumed: {len(cmp)} compared, largest "
                         f"difference {worst[1]['abs_diff']:.3g} ({worst[0]})")
        lines.append("")
    sc = res.get("sample_compile", {})
    if sc and "error" not in sc:
        lines += ["## `sample_compile: reduce-overhead` in a fit (monitors sampling through `generate`)", "",
                  "| config | exit eager / compiled | seconds eager / compiled | max rel. difference of the monitors' values |",
                  "|---|---|---|---|"]
        for k, v in sc.items():
            if isinstance(v, dict) and "rc" in v:
                d = v["max_rel_diff_compiled_vs_eager"]
                lines.append(f"| {k} | {v['rc']['eager']} / {v['rc']['reduce-overhead']} | "
                             f"{v['seconds']['eager']:.0f} / {v['seconds']['reduce-overhead']:.0f} | "
                             + (", ".join(f"{kk} {vv:.1e}" for kk, vv in d.items()) or "-") + " |")
        lines.append("")
    cfgs = res.get("configs", {})
    if cfgs and "error" not in cfgs:
        lines += ["## Shipped configs, one short epoch on the GPU", "", "| config | exit | seconds | logged keys | non-finite |",
                  "|---|---|---|---|---|"]
        for k, v in cfgs.items():
            if isinstance(v, dict) and "rc" in v:
                lines.append(f"| {k} | {v['rc']} | {v['seconds']:.0f} | {v['logged_keys']} | {', '.join(v['nonfinite_keys']) or '-'} |")
        lines.append("")
    for k in SECTIONS:
        if isinstance(res.get(k), dict) and "error" in res[k]:
            lines += [f"## {k}: error", "", "```", res[k]["error"][-1500:], "```", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_gpu.json")
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--emp-n", type=int, default=4096)
    ap.add_argument("--emp-m", type=int, default=4096)
    ap.add_argument("--emp-check-m", type=int, default=256)
    ap.add_argument("--emp-ties", type=int, default=32, help="near-tie rows (80-bit reference on the CPU)")
    ap.add_argument("--flow-m-mlp", type=int, default=4096)
    ap.add_argument("--flow-m-unet", type=int, default=1024)
    ap.add_argument("--flow-batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--config-batches", type=int, default=8, help="training batches per config (configs section)")
    ap.add_argument("--configs", nargs="+", default=list(OFFLINE_CONFIGS), help="configs section: which configs "
                    "(distill_vp_digits needs teacher_edm_digits before it)")
    ap.add_argument("--fit-extra", default="", help="extra fit arguments in one string, e.g. "
                    "'--data.init_args.samples_per_epoch 640' (a smaller epoch)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    res = {"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "commit": os.environ.get("LPFD_COMMIT", commit), "argv": sys.argv[1:]}}
    if args.out.exists():
        try:
            res = {**json.loads(args.out.read_text()), **res}
        except ValueError:
            pass
    prev = res.get("configs")
    args.previous_configs = prev if isinstance(prev, dict) and "error" not in prev else {}
    args.previous_configs.pop("section_seconds", None)
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            res[name] = globals()[f"section_{name}"](args)
        except Exception:
            res[name] = {"error": traceback.format_exc()[-4000:]}
        res[name]["section_seconds"] = time.perf_counter() - t0
        print(f"[{name}] {res[name]['section_seconds']:.0f} s", flush=True)
        args.out.write_text(json.dumps(res, indent=1, default=str))
    md = _markdown(res)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
