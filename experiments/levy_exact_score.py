"""Record the exact-score sampler check and the truncation figures of docs/levy.md:
``experiments/results/levy_exact_score.json``.

docs/levy.md quotes (checked by ``tests/test_quoted_numbers_benchmarks.py``):

* **the exact-score check of the LIM samplers on the PITE data**: LIM at alpha = 1.7 with the
  *exact* fractional score of the empirical distribution of the 2048 training crops (16x16, in
  training space; ``PrecipitationDataModule`` with the ``experiments/pite_lim`` data settings),
  the sub-Gaussian factor A of the noise discretised on ``--nodes`` quantile nodes of its law
  clamped at 20 (the v2 training noise), ``--samples`` samples from the clamped alpha-stable prior
  (``x_T = sigma(T) eps``, seeds 0...), integrated by ``levy_sample`` with each sampler / grid /
  step count of the table. The exact flow ends on a training crop, so the distance of the end
  point to the nearest crop (Euclidean over the 256 pixels) is discretisation error: median and
  maximum over the samples, and the floor r(t_min) |eps| of stopping at t_min;
* **the factor A at alpha = 1.7** from ``--draws`` seeded draws (seeds 0, 1, ...): its median,
  P(A >= 20), P(A >= 20 c_alpha = 7.22) and P(A >= 20/kappa = 42.2) (the reference's threshold on
  the standard scale);
* **the data's crop maxima** (mm/h) of the 2048 training crops: the number of distinct values
  among the top k (k = 2 % of the crops, as ``pite``'s Hill estimate) and how often the largest
  value occurs there;
* **the coverage of the tail-index bootstrap**: the measurement of
  ``tests/test_tails.py::test_hill_bootstrap_over_images_covers_the_index`` (40 synthetic data
  sets of 300 Pareto(2.5) peaks, each seen 1-5 times, the same seeds), counted: how many 90 %
  bootstrap intervals over images and how many naive alpha +- 1.645 alpha/sqrt(k) cover 2.5.

Deterministic (seeded draws, exact score, fixed crops); one to two minutes on one CPU core.

Usage (from the repository root):

    python experiments/levy_exact_score.py            # writes experiments/results/levy_exact_score.json
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
OUT = "experiments/results/levy_exact_score.json"  # relative to the repository root
ALPHA = 1.7
CLAMP_A = 20.0
#: (sampler, time grid, steps) of the page's table
SAMPLERS = [("ode", "uniform", 50), ("ode", "uniform", 100), ("ddim", "edm", 50), ("heun", "edm", 25),
            ("heun", "edm", 100)]


def training_crops():
    """The 2048 training crops of the PITE configs (training space, float64, (N, 256)) and the
    datamodule (for its inverse transform)."""
    import yaml

    from lightning_pfd.data import PrecipitationDataModule

    cfg = yaml.safe_load((REPO / "lightning_pfd/configs/experiments/pite_lim.yaml").read_text())
    args = {k: v for k, v in cfg["data"]["init_args"].items() if k != "batch_size"}
    dm = PrecipitationDataModule(**args)
    dm.setup("fit")
    return dm.train_data.to(torch.float64).reshape(len(dm.train_data), -1), dm


def factor_nodes(n_nodes: int, draws: int) -> torch.Tensor:
    """Quantile nodes (k + 1/2)/n of A clamped at 20, from ``draws`` seeded draws."""
    from lightning_pfd.diffusion.levy import sample_subgaussian_factor

    A = sample_subgaussian_factor(ALPHA, draws, seeds=torch.arange(draws), clamp_A=CLAMP_A)[:, 0]
    u = (torch.arange(n_nodes, dtype=torch.float64) + 0.5) / n_nodes
    return torch.quantile(A, u)


def exact_score(data: torch.Tensor, nodes: torch.Tensor, schedule):
    """S(x, t) = -(x - gamma E[x0 | x_t = x]) / (alpha sigma^alpha) for the empirical data and the
    discretised factor A (equal weights): given A_k, x_t | x0 ~ N(gamma x0, sigma^2 A_k I)."""
    d = data.shape[1]
    sq_data = (data * data).sum(1)

    def score(x, t):
        shape = x.shape
        x = x.reshape(len(x), -1)
        g, s = float(schedule.gamma(t)), float(schedule.sigma(t))
        dist2 = (x * x).sum(1, keepdim=True) - 2 * g * x @ data.T + g * g * sq_data  # |x - g y|^2, (B, N)
        # log p(x | y_i, A_k) up to a constant: -d/2 log A_k - dist2 / (2 s^2 A_k)
        logw = -0.5 * d * nodes.log()[None, None, :] - dist2[:, :, None] / (2 * s * s * nodes[None, None, :])
        w = torch.softmax(logw.reshape(len(x), -1), 1).reshape(logw.shape).sum(2)  # posterior over crops
        x0 = w @ data
        return (-(x - g * x0) / (ALPHA * s ** ALPHA)).reshape(shape)

    return score


def sampler_table(data, nodes, n_samples: int):
    from lightning_pfd.diffusion.levy import CosineSchedule, levy_sample, sample_alpha_stable

    sch = CosineSchedule(ALPHA)
    eps = sample_alpha_stable(ALPHA, (data.shape[1],), seeds=range(n_samples), clamp_A=CLAMP_A)
    x_T = sch.sigma(sch.T) * eps
    score = exact_score(data, nodes, sch)
    rows = []
    for sampler, grid, steps in SAMPLERS:
        t0 = time.perf_counter()
        x = levy_sample(score, x_T, sch, num_steps=steps, sampler=sampler, time_grid=grid)
        dist = torch.cdist(x, data).min(1).values
        rows.append({"sampler": sampler, "grid": grid, "steps": steps,
                     "network_calls": steps * (2 if sampler == "heun" else 1),
                     "median_distance": float(dist.median()), "max_distance": float(dist.max()),
                     "median_rms_per_pixel": float(dist.median() / math.sqrt(data.shape[1])),
                     "seconds": round(time.perf_counter() - t0, 1)})
    floor = float(sch.nsr(sch.t_min)) * eps.norm(dim=1)
    return rows, {"r_t_min": float(sch.nsr(sch.t_min)), "median": float(floor.median()), "max": float(floor.max())}


def factor_figures(draws: int) -> dict:
    from lightning_pfd.diffusion.levy import lim_reference_scale, sample_subgaussian_factor, subgaussian_constant

    A = sample_subgaussian_factor(ALPHA, draws, seeds=torch.arange(draws))[:, 0]
    c_alpha, kappa = subgaussian_constant(ALPHA), lim_reference_scale(ALPHA)
    share = lambda c: float((A >= c).double().mean())  # noqa: E731
    return {"draws": draws, "seeds": f"0..{draws - 1}", "c_alpha": c_alpha, "kappa": kappa, "median": float(A.median()),
            "p_ge_20": share(20.0), "p_ge_20_c_alpha": share(20 * c_alpha), "threshold_20_c_alpha": 20 * c_alpha,
            "p_ge_20_over_kappa": share(20 / kappa), "threshold_20_over_kappa": 20 / kappa}


def crop_maxima_figures(data, dm) -> dict:
    mx = dm.inverse_transform(data.to(torch.float32)).reshape(len(data), -1).to(torch.float64).amax(1)
    top = mx.sort(descending=True).values
    out = {"n": len(mx), "max_mm_h": float(top[0]), "top": []}
    for k in (40, 41, 102):
        t = top[:k]
        out["top"].append({"k": k, "distinct": int(torch.unique(t).numel()), "count_of_max": int((t == top[0]).sum())})
    return out


def hill_coverage(n_sets: int = 40, n_images: int = 300, alpha: float = 2.5) -> dict:
    """The loop of tests/test_tails.py::test_hill_bootstrap_over_images_covers_the_index (its
    seeds and its ``_pareto_images``), with the counts kept."""
    import numpy as np
    from scipy import stats

    from lightning_pfd.metrics.tails import hill_bootstrap

    rng = np.random.default_rng(11)
    boot = naive = 0
    for _ in range(n_sets):
        peaks = stats.pareto(alpha).rvs(n_images, random_state=rng)
        reps = rng.integers(1, 6, n_images)
        vals, img = np.repeat(peaks, reps), np.repeat(np.arange(n_images), reps)
        b = hill_bootstrap(vals, img, k_fraction=0.1, num_boot=150, seed=int(rng.integers(1 << 30)))
        boot += bool(b["lo"] <= alpha <= b["hi"])
        naive += bool(abs(b["alpha"] - alpha) <= 1.645 * b["se_asymptotic"])
    return {"data_sets": n_sets, "images": n_images, "alpha": alpha, "bootstrap_covers": boot, "naive_covers": naive}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--draws", type=int, default=10 ** 6)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data, dm = training_crops()
    nodes = factor_nodes(args.nodes, args.draws)
    rows, floor = sampler_table(data, nodes, args.samples)
    rec = {"args": vars(args), "alpha": ALPHA, "clamp_A": CLAMP_A, "n_crops": len(data), "pixels": data.shape[1],
           "nodes": nodes.tolist(), "samplers": rows, "floor_r_t_min_eps": floor,
           "factor": factor_figures(args.draws), "crop_maxima": crop_maxima_figures(data, dm),
           "hill_coverage": hill_coverage(),
           "wall_s": round(time.perf_counter() - t0, 1), "torch": torch.__version__}
    out = Path(args.out)
    (out if out.is_absolute() else REPO / out).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


if __name__ == "__main__":
    r = main()
    for row in r["samplers"]:
        print(row)
    print(r["floor_r_t_min_eps"], r["factor"], r["crop_maxima"], r["hill_coverage"], r["wall_s"])
