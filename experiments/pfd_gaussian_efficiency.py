"""PFD paper App. C.1, Fig. 6a: sample efficiency of PFD vs sample W2 (exact OT) vs FID on 5-D Gaussians.

For R random pairs of 5-D Gaussians and M in {128, ..., 4096}:
  - PFD through the real sampler: Heun-18 flows (T = 80) of the two exact GaussianDenoisers on M
    shared seeds (eq. 4), and through the T -> infinity flow map mu + Sigma^1/2 z (eq. 36: Monte
    Carlo error only), vs eq. 39;
  - sample W2: exact optimal transport (POT ot.emd2) between M samples of p and M of q, vs eq. 41;
  - FID: torchmetrics' FrechetInceptionDistance with the identity descriptor on the same samples,
    vs its target W2^2 (eq. 41 squared).
Reports the mean (and std) over pairs of the relative error |E - E_hat| / |E|.

    python experiments/pfd_gaussian_efficiency.py --repeats 10 --out experiments/results/pfd_gaussian_efficiency.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from lightning_pfd.diffusion import GaussianDenoiser, seeded_noise
from lightning_pfd.metrics import ProbabilityFlowDistance, probability_flow_distance
from lightning_pfd.metrics.baselines import frechet_distance, gaussian_pfd, gaussian_w2, sample_w2


def random_gaussian(g: torch.Generator, d: int):
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    return torch.randn(d, generator=g, dtype=torch.float64), A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dim", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(args.seed)
    rows = {M: {"pfd_heun": [], "pfd_exact_flow": [], "w2_ot": [], "fid": []} for M in args.sizes}
    t0 = time.time()
    for r in range(args.repeats):
        (m1, S1), (m2, S2) = random_gaussian(g, args.dim), random_gaussian(g, args.dim)
        p, q = GaussianDenoiser(m1, S1), GaussianDenoiser(m2, S2)
        pfd, w2 = float(gaussian_pfd(m1, S1, m2, S2)), float(gaussian_w2(m1, S1, m2, S2))
        for M in args.sizes:
            seeds = range(r * 100_000, r * 100_000 + M)  # fresh noise per repeat
            est = float(probability_flow_distance(p, q, seeds=seeds, shape=(args.dim,), batch_size=4096))
            z = seeded_noise(seeds, (args.dim,))
            exact = ProbabilityFlowDistance()
            exact.update(m1 + z @ p.sqrt_cov(), m2 + z @ q.sqrt_cov())  # T -> infinity limit, eq. 36
            x = p.sample(range(10_000_000 + r * 100_000, 10_000_000 + r * 100_000 + M))
            y = q.sample(range(20_000_000 + r * 100_000, 20_000_000 + r * 100_000 + M))
            w2_hat = float(sample_w2(x, y))
            fid = float(frechet_distance(x, y))
            rows[M]["pfd_heun"].append(abs(est - pfd) / pfd)
            rows[M]["pfd_exact_flow"].append(abs(float(exact.compute()) - pfd) / pfd)
            rows[M]["w2_ot"].append(abs(w2_hat - w2) / w2)
            rows[M]["fid"].append(abs(fid - w2**2) / w2**2)
        print(f"repeat {r + 1}/{args.repeats} done ({time.time() - t0:.0f} s)", flush=True)
    summary = {}
    print(f"\nrelative error, mean (std) over {args.repeats} random {args.dim}-D Gaussian pairs")
    print("| M | PFD (Heun-18, T=80) | PFD (exact map, eq. 36) | W2 (exact OT) | FID vs W2^2 |")
    print("|---|---|---|---|---|")
    for M in args.sizes:
        s = {k: (torch.tensor(v).mean().item(), torch.tensor(v).std().item()) for k, v in rows[M].items()}
        summary[M] = s
        print(f"| {M} | " + " | ".join(f"{s[k][0]:.2e} ({s[k][1]:.1e})" for k in
                                      ("pfd_heun", "pfd_exact_flow", "w2_ot", "fid")) + " |")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "raw": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
