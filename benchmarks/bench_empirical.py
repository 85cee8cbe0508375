"""Benchmark: mixed-precision vs float64 EmpiricalDenoiser over a Heun-18 PF-ODE (PFD paper eq. 46).

For each data set (smooth random images in [-1, 1], and iid uniform noise in [-1, 1]) the
empirical PF-ODE is run once from x_T = 80 z with Heun-18 (EDM grid, 35 denoiser calls) and every
call's (x, sigma) is recorded: x is then a noisy point near the data, as in a real E_mem
computation, which is what the candidate counts of the mixed path depend on. Each recorded call
is then timed with four variants, interleaved call by call and repeat by repeat in one process
(the machine is shared, so only ratios are reported; each call's time is its best repeat, both in
wall-clock time and in process CPU time -- the latter is much less sensitive to other processes):

* ``mixed``: ``EmpiricalDenoiser(data)`` (float32 candidate search + float64 rescoring),
* ``float64``: ``EmpiricalDenoiser(data, precision="float64")`` (the previous algorithm),
* ``floor32`` / ``floor64``: the two matmuls of one call, (M, D) @ (D, N) and (M, N) @ (N, D),
  in float32 / float64 -- the cost of the dense softmax at the machine's matmul rate.

``rate_vs_float32 = floor32 / mixed`` summed over the 35 calls is the fraction of the float32
matmul rate the mixed denoiser reaches (1.0: as fast as the dense float32 matmuls);
``speedup_vs_float64 = float64 / mixed``.

    python benchmarks/bench_empirical.py           # N=4096, 3x32x32, M=1024, 2 threads
    python benchmarks/bench_empirical.py --quick   # small sizes, seconds
    python benchmarks/bench_empirical.py --n 2048 --m 256 --repeats 2   # any sizes (run(config=...))
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from lightning_pfd.diffusion import EmpiricalDenoiser, heun_sample, karras_sigmas, seeded_noise
from lightning_pfd.errors import ConfigError

FULL = dict(n=4096, shape=(3, 32, 32), m=1024, repeats=3)
QUICK = dict(n=512, shape=(3, 16, 16), m=128, repeats=2)


def smooth_images(n: int, shape, seed: int = 0) -> torch.Tensor:
    """Images in [-1, 1] with CIFAR-like spatial correlation: upsampled multi-scale noise with
    correlated channels, squashed by tanh."""
    g = torch.Generator().manual_seed(seed)
    c, h, w = shape
    img = torch.zeros(n, c, h, w, dtype=torch.float64)
    for res, amp in ((2, 1.0), (4, 0.7), (8, 0.45), (16, 0.25), (32, 0.1)):
        res = min(res, h)
        z = torch.randn(n, c, res, res, generator=g, dtype=torch.float64)
        z = 0.6 * z + 0.4 * z.mean(1, keepdim=True)
        img += amp * F.interpolate(z, size=(h, w), mode="bilinear", align_corners=False)
    return torch.tanh(img)


def iid_images(n: int, shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g, dtype=torch.float64) * 2 - 1


def record_calls(denoiser, m: int, shape) -> list:
    """(x, sigma) of every denoiser call of a Heun-18 PF-ODE from x_T = 80 z (35 calls)."""
    calls = []

    def recorder(x, sigma):
        calls.append((x.clone(), float(sigma)))
        return denoiser(x, sigma)

    sigmas = karras_sigmas(18)
    heun_sample(recorder, seeded_noise(range(m), shape) * float(sigmas[0]), sigmas)
    return calls


def _timed(fn) -> tuple:
    """(wall seconds, process CPU seconds) of one call."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def _bench_dataset(data: torch.Tensor, m: int, repeats: int) -> dict:
    n = data.shape[0]
    mixed = EmpiricalDenoiser(data)
    exact = EmpiricalDenoiser(data, precision="float64")
    calls = record_calls(mixed, m, tuple(data.shape[1:]))
    d = data[0].numel()
    g = torch.Generator().manual_seed(1)
    a32, p32 = torch.randn(m, d, generator=g), torch.rand(m, n, generator=g)
    y32 = data.reshape(n, -1).float()
    a64, p64, y64 = a32.double(), p32.double(), data.reshape(n, -1).double()
    variants = {
        "mixed": lambda x, s: mixed(x, s),
        "float64": lambda x, s: exact(x, s),
        "floor32": lambda x, s: (a32 @ y32.T, p32 @ y32),
        "floor64": lambda x, s: (a64 @ y64.T, p64 @ y64),
    }
    names = list(variants)
    best = {k: [float("inf")] * len(calls) for k in names}  # wall clock
    cpu = {k: [float("inf")] * len(calls) for k in names}  # process CPU time
    for rep in range(repeats):
        for j, (x, s) in enumerate(calls):
            k0 = (rep + j) % len(names)  # rotate the order so no variant always runs first
            for k in names[k0:] + names[:k0]:
                w, c = _timed(lambda: variants[k](x, s))
                best[k][j], cpu[k][j] = min(best[k][j], w), min(cpu[k][j], c)
    per_call = []
    for j, (x, s) in enumerate(calls):
        out, ref = mixed(x, s), exact(x, s)
        st = mixed.last_stats
        cand = torch.tensor(st["candidates"], dtype=torch.float64)
        diff = (out - ref).abs()
        per_call.append({
            "sigma": s,
            "dense_rows": st["dense_rows"] / st["rows"],
            "candidates_mean": float(cand.mean()) if cand.numel() else None,
            "candidates_max": int(cand.max()) if cand.numel() else None,
            "max_abs_diff": float(diff.max()),
            "within_1e-9": bool((diff <= 1e-9 + 1e-9 * ref.abs()).all()),
            **{f"t_{k}": best[k][j] for k in names},
            **{f"cpu_{k}": cpu[k][j] for k in names},
        })
    tot = {k: sum(best[k]) for k in names}
    ctot = {k: sum(cpu[k]) for k in names}
    return {
        "rate_vs_float32": tot["floor32"] / tot["mixed"],
        "rate_vs_float64_floor": tot["floor64"] / tot["mixed"],
        "speedup_vs_float64": tot["float64"] / tot["mixed"],
        "float64_vs_float64_floor": tot["floor64"] / tot["float64"],
        "float32_over_float64_rate": tot["floor64"] / tot["floor32"],
        "cpu_rate_vs_float32": ctot["floor32"] / ctot["mixed"],
        "cpu_speedup_vs_float64": ctot["float64"] / ctot["mixed"],
        "cpu_float32_over_float64_rate": ctot["floor64"] / ctot["floor32"],
        "calls_mostly_dense": sum(c["dense_rows"] > 0.5 for c in per_call) / len(per_call),
        "time_share_of_dense_calls":
            sum(c["cpu_mixed"] for c in per_call if c["dense_rows"] > 0.5) / ctot["mixed"],
        "all_within_1e-9": all(c["within_1e-9"] for c in per_call),
        "max_abs_diff": max(c["max_abs_diff"] for c in per_call),
        "per_call": per_call,
    }


def resolve_config(quick: bool = False, config: Optional[dict] = None) -> dict:
    """QUICK or FULL sizes with the entries of ``config`` (``n``, ``shape``, ``m``, ``repeats``)
    overriding them; an unknown key or a bad value raises ConfigError (a ValueError)."""
    cfg = dict(QUICK if quick else FULL)
    extra = set(config or {}) - set(cfg)
    if extra:
        raise ConfigError("config", f"unknown keys {sorted(extra)}", value=sorted(config), accepted=sorted(cfg))
    cfg.update(config or {})
    for key in ("n", "m", "repeats"):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ConfigError(f"config.{key}", "must be an integer >= 1", value=cfg[key])
    shape = cfg["shape"]
    if not isinstance(shape, (list, tuple)) or len(shape) != 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
        raise ConfigError("config.shape", "must be (channels, height, width), integers >= 1", value=shape,
                          accepted="e.g. (3, 32, 32)")
    cfg["shape"] = tuple(shape)
    return cfg


def run(quick: bool = False, threads: int = 2, config: Optional[dict] = None) -> dict:
    """Time the mixed and float64 denoisers on the 35 calls of a Heun-18 PF-ODE; see module doc.

    Sizes: QUICK (``quick=True``) or FULL, with ``config`` entries (``n``, ``shape``, ``m``,
    ``repeats``) overriding them, e.g. ``run(config=dict(n=2048, m=256, repeats=2))``."""
    cfg = resolve_config(quick, config)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = {"config": {**cfg, "shape": list(cfg["shape"]), "threads": threads, "nfe": 35}}
        for name, make in (("smooth", smooth_images), ("iid", iid_images)):
            data = make(cfg["n"], cfg["shape"], seed=0)
            out[name] = _bench_dataset(data, cfg["m"], cfg["repeats"])
        return out
    finally:
        torch.set_num_threads(old_threads)


def _table(res: dict) -> str:
    c = res["config"]
    lines = [f"N = {c['n']}, D = {'x'.join(map(str, c['shape']))}, M = {c['m']}, {c['threads']} threads, "
             f"35 Heun-18 calls, best of {c['repeats']} interleaved repeats", "",
             "| data | rate vs float32 floor (wall / CPU) | speedup vs float64 (wall / CPU) "
             "| float32 / float64 matmul rate | mostly-dense calls | their time share | all within 1e-9 |",
             "|---|---|---|---|---|---|---|"]
    for name in ("smooth", "iid"):
        r = res[name]
        lines.append(f"| {name} | {r['rate_vs_float32']:.2f} / {r['cpu_rate_vs_float32']:.2f} | "
                     f"{r['speedup_vs_float64']:.2f} / {r['cpu_speedup_vs_float64']:.2f} | "
                     f"{r['float32_over_float64_rate']:.2f} | {r['calls_mostly_dense']:.2f} | "
                     f"{r['time_share_of_dense_calls']:.2f} | {r['all_within_1e-9']} |")
    for name in ("smooth", "iid"):
        lines += ["", f"{name}: per sigma (first call of each Heun step)", "",
                  "| sigma | dense rows | candidates mean / max | mixed / floor32 (CPU) "
                  "| float64 / mixed (CPU) |",
                  "|---|---|---|---|---|"]
        seen = set()
        for p in res[name]["per_call"]:
            if p["sigma"] in seen:
                continue
            seen.add(p["sigma"])
            cm = ("-" if p["candidates_mean"] is None
                  else f"{p['candidates_mean']:.1f} / {p['candidates_max']}")
            lines.append(f"| {p['sigma']:.4g} | {p['dense_rows']:.2f} | {cm} | "
                         f"{p['cpu_mixed'] / p['cpu_floor32']:.2f} | "
                         f"{p['cpu_float64'] / p['cpu_mixed']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the full result here")
    ap.add_argument("--n", type=int, help="training points N (overrides --quick / the full size)")
    ap.add_argument("--shape", type=int, nargs=3, metavar=("C", "H", "W"), help="shape of one image")
    ap.add_argument("--m", type=int, help="denoiser rows per call (the M seeds of the flow)")
    ap.add_argument("--repeats", type=int, help="interleaved repeats (each call's best is kept)")
    args = ap.parse_args()
    overrides = {k: getattr(args, k) for k in ("n", "shape", "m", "repeats") if getattr(args, k) is not None}
    result = run(quick=args.quick, threads=args.threads, config=overrides)
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
