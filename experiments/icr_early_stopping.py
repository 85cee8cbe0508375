"""False stops and stop delays of ICREarlyStopping's rise test (docs/icr.md, "ICREarlyStopping:
the rise test").

Synthetic ICR runs in ICRMonitor's format: every check has a full estimate y_t and G = 16
delete-a-group jackknife replicates r_{t,g}. Group g contributes x_{t,g} = mu_t + b_g + u_{t,g}
(b_g: the fixed image groups, u: group noise), y_t = mean_g x_{t,g} + eta_t and
r_{t,g} = mean_{h != g} x_{t,h} + eta_t (eta: training noise common to all groups). The null
families (a flat or decaying ICR, no rise) are split into a tuning half and a held-out half;
the window, the noise model and the default min_rise_z were chosen on the tuning half only.

    OMP_NUM_THREADS=1 python experiments/icr_early_stopping.py               # full tables (~minutes)
    OMP_NUM_THREADS=1 python experiments/icr_early_stopping.py --runs 40     # quick look
    OMP_NUM_THREADS=1 python experiments/icr_early_stopping.py --trainer 30  # + runs through a real Trainer
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from lightning_pfd.analysis.early_stop import DEFAULT_WINDOW, rise_test

G = 16
SE = 0.01  # standard error of one ICR value from the group noise (sd_u / sqrt(G))
LEVEL = 0.35

#: tuning half / held-out half of the null families
TUNE = ("white", "ar_train", "heavy_groups", "decay_plateau")
HELD_OUT = ("growing", "group_drift", "smooth_train", "shrinking", "heavy_ar")
ZS = (2.0, 2.5, 3.0)


def _ar1(rng, n, phi, sd):
    out = np.empty(n)
    out[0] = rng.standard_normal() * sd
    e = rng.standard_normal(n) * sd * math.sqrt(1 - phi ** 2)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + e[i]
    return out


def simulate(family: str, n: int, seed: int, mu=None):
    """(values (n,), replicates (n, G)) of one synthetic run; ``mu`` (n,) replaces the flat level."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64)
    sd_u = SE * math.sqrt(G)
    mu = np.full(n, LEVEL) if mu is None else np.asarray(mu, dtype=np.float64)
    scale = np.ones(n)
    eta = np.zeros(n)
    u = rng.standard_normal((n, G))
    if family == "white":
        pass
    elif family == "ar_train":
        eta = _ar1(rng, n, 0.8, SE)
    elif family == "heavy_groups":
        u = rng.standard_t(3, (n, G)) / math.sqrt(3.0)
        eta = 0.5 * SE * rng.standard_normal(n)
    elif family == "decay_plateau":
        mu = mu + 0.1 * np.exp(-t / 8.0)
        eta = _ar1(rng, n, 0.6, 0.5 * SE)
    elif family == "growing":
        scale = 1.0 + 1.5 * t / max(n - 1, 1)
        eta = _ar1(rng, n, 0.8, SE) * scale
    elif family == "group_drift":
        u = np.stack([_ar1(rng, n, 0.9, 1.0) for _ in range(G)], 1)
        eta = 0.3 * SE * rng.standard_normal(n)
    elif family == "smooth_train":
        raw = rng.standard_normal(n + 24)
        k = np.exp(-0.5 * (np.arange(-12, 13) / 3.0) ** 2)
        sm = np.convolve(raw, k / math.sqrt((k ** 2).sum()), mode="valid")[:n]
        eta = SE * sm
    elif family == "shrinking":
        scale = 2.5 - 1.5 * t / max(n - 1, 1)
        eta = _ar1(rng, n, 0.8, SE) * scale
    elif family == "heavy_ar":
        u = rng.standard_t(3, (n, G)) / math.sqrt(3.0)
        eta = _ar1(rng, n, 0.9, SE)
    else:
        raise ValueError(family)
    b = 0.05 * rng.standard_normal(G)
    x = mu[:, None] + b[None, :] + sd_u * scale[:, None] * u
    tot = x.sum(1)
    y = tot / G + eta
    reps = (tot[:, None] - x) / (G - 1) + eta[:, None]
    return y, reps


def old_rule(y, reps, min_rise_z, patience=5):
    """The previous ICREarlyStopping(min_rise_z): patience on the raw value, then a paired
    z of (now - best) >= min_rise_z, re-tested at every check. Returns the stop index or None."""
    best, best_i, wait = math.inf, -1, 0
    for i, v in enumerate(y):
        if v < best:
            best, best_i, wait = v, i, 0
            continue
        wait += 1
        if wait >= patience:
            d = reps[i] - reps[best_i]
            se = math.sqrt((G - 1) / G * ((d - d.mean()) ** 2).sum())
            z = (y[i] - y[best_i]) / se if se > 0 else (math.inf if y[i] > y[best_i] else 0.0)
            if z >= min_rise_z:
                return i
    return None


def new_rule_zs(y, reps, horizon, patience=5, window=DEFAULT_WINDOW, seed=0, min_z=None):
    """(z of every check, patience-exhausted flag of every check): the rise test at each check."""
    zs, pat = [], []
    best, wait = math.inf, 0
    for i in range(1, y.size + 1):
        v = y[i - 1]
        if v < best:
            best, wait = v, 0
        else:
            wait += 1
        r = rise_test(y[:i], reps[:i], horizon=horizon, window=window, seed=seed, min_z=min_z)
        zs.append(r.z)
        pat.append(wait >= patience)
    return np.array(zs), np.array(pat)


def first_stop(zs, pat, z):
    hit = np.nonzero(pat & (np.nan_to_num(zs, nan=-np.inf) >= z))[0]
    return int(hit[0]) if hit.size else None


def wilson_upper(k, n, z=1.96):
    if n == 0:
        return math.nan
    p = k / n
    den = 1 + z * z / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / den


def null_table(families, runs, lengths=(40, 100), seed0=0):
    out = {}
    for fam in families:
        stops = {z: 0 for z in ZS}
        old = {z: 0 for z in ZS}
        t0 = time.time()
        for r in range(runs):
            n = lengths[r % len(lengths)]
            y, reps = simulate(fam, n, seed0 + r)
            zs, pat = new_rule_zs(y, reps, horizon=n, seed=r, min_z=max(ZS))
            for z in ZS:
                stops[z] += first_stop(zs, pat, z) is not None
                old[z] += old_rule(y, reps, z) is not None
        out[fam] = {f"z={z:g}": {"stops": stops[z], "runs": runs, "rate": stops[z] / runs,
                                 "wilson95_upper": wilson_upper(stops[z], runs)} for z in ZS}
        out[fam]["old_rule"] = {f"z={z:g}": {"stops": old[z], "runs": runs, "rate": old[z] / runs} for z in ZS}
        out[fam]["seconds"] = round(time.time() - t0, 1)
        print(fam, {k: (v["stops"], round(v["wilson95_upper"], 3)) for k, v in out[fam].items()
                    if k.startswith("z=")}, "old:", {k: v["stops"] for k, v in out[fam]["old_rule"].items()},
              f"{out[fam]['seconds']}s", flush=True)
    return out


def u_shape(n, t_min, rise):
    """Falls from LEVEL + 0.1 to LEVEL at t_min, then rises linearly by ``rise`` to the end."""
    t = np.arange(n, dtype=np.float64)
    down = LEVEL + 0.1 * np.clip((t_min - t) / t_min, 0, None)
    up = rise * np.clip((t - t_min) / max(n - 1 - t_min, 1), 0, None)
    return down + up


RECORDED = [0.478, 0.333, 0.377, 0.372, 0.378, 0.367, 0.366, 0.371, 0.357, 0.347, 0.351, 0.365, 0.375,
            0.394, 0.407, 0.422, 0.432, 0.433, 0.441, 0.44]  # experiments/results/icr_unet.json, small


def power_table(runs, seed0=10_000):
    cases = {"u60_rise0.05": (60, 20, 0.05), "u60_rise0.1": (60, 20, 0.1), "u100_rise0.1": (100, 40, 0.1),
             "u100_rise0.05": (100, 40, 0.05)}
    out = {}
    for name, (n, t_min, rise) in cases.items():
        mu = u_shape(n, t_min, rise)
        for fam in ("white", "ar_train"):
            res = {}
            for z in ZS:
                res[z] = []
            for r in range(runs):
                y, reps = simulate(fam, n, seed0 + r, mu=mu - 0.0)
                if fam != "white":
                    pass
                zs, pat = new_rule_zs(y, reps, horizon=n, seed=r, min_z=max(ZS))
                for z in ZS:
                    res[z].append(first_stop(zs, pat, z))
            row = {}
            for z in ZS:
                st = [s for s in res[z] if s is not None]
                row[f"z={z:g}"] = {"stopped": len(st), "runs": runs,
                                   "before_min": sum(s < t_min for s in st),
                                   "delay_quartiles": [float(q) for q in np.percentile(np.array(st) - t_min, [25, 50, 75])] if st else None}
            out[f"{name}/{fam}"] = {"n": n, "true_min": t_min, "rise": rise, **row}
            print(name, fam, row, flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--power-runs", type=int, default=100)
    p.add_argument("--families", nargs="*", default=None)
    p.add_argument("--out", default="experiments/results/icr_early_stopping.json")
    args = p.parse_args(argv)
    t0 = time.time()
    fams = args.families or list(TUNE + HELD_OUT)
    result = {"command": "OMP_NUM_THREADS=1 python " + " ".join(["experiments/icr_early_stopping.py"] + sys.argv[1:]),
              "tuning_families": list(TUNE), "held_out_families": list(HELD_OUT),
              "nulls": null_table(fams, args.runs)}
    if args.power_runs:
        result["u_shapes"] = power_table(args.power_runs)
    result["wall_seconds"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("wrote", args.out, result["wall_seconds"], "s")


if __name__ == "__main__":
    main()
