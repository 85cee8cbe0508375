"""ICR dynamics, data-limited vs data-rich (ICR paper Sec. 5.2, Fig. 5 / Fig. 4) on the UCI digits.

Two EDM-preconditioned MLP denoisers (MLPNet, 64-d digits as vectors) are trained with the same
number of optimizer steps on N_limited and N_rich training images. After every epoch:

- ICR on a fixed seeded subset of the *training* images (all of them when N is small), features
  at the MLP's middle tap through a fixed random projection to d = ``--d-proj`` so that n >= 4 d,
  ``--views`` view pairs per image, views = augmentation level 3 applied to the digits as 8x8
  images (crop + flip; no colour jitter on 1 channel) then noise at sigma* = 0.29;
- the memorization ratio of ``--mem-samples`` Heun-18 samples (pixel-space d1/d2 < 1/3).

Prints the per-epoch curves and a summary (epoch of the ICR minimum, epoch at which the
memorization ratio starts rising, n, d) and writes them as JSON.

    nice -n 10 python experiments/icr_dynamics.py --out experiments/results/icr_dynamics.json
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch


def run(n_train: int, args) -> dict:
    import lightning.pytorch as pl

    from lightning_pfd.callbacks import ICRMonitor, MemorizationMonitor
    from lightning_pfd.data import DigitsDataModule
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    pl.seed_everything(args.seed, verbose=False)
    dm = DigitsDataModule(as_vector=True, n_train=n_train, batch_size=args.batch_size,
                          samples_per_epoch=args.steps_per_epoch * args.batch_size, seed=args.seed)
    net = MLPNet(dim=64, hidden=args.hidden, depth=args.depth)
    module = DiffusionModule(net, family="edm", lr=args.lr, ema_decay=args.ema)
    icr = ICRMonitor(num_images=min(n_train, args.icr_images), sigma=0.29, level=3,
                     image_shape=(1, 8, 8), d_proj=args.d_proj, views_per_image=args.views,
                     seed=1, tap=args.tap)
    mem = MemorizationMonitor(num_samples=args.mem_samples, every_n_epochs=1,
                              criterion="nn_ratio", batch_size=args.mem_samples)
    trainer = pl.Trainer(max_epochs=args.epochs, callbacks=[icr, mem], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=1,
                         num_sanity_val_steps=0, accelerator="cpu", devices=1)
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    epochs = [{**a, **{k: v for k, v in b.items() if k != "epoch"}}
              for a, b in zip(icr.history, mem.history)]
    return {"n_train": n_train, "seconds": time.time() - t0, "epochs": epochs,
            "summary": summarize(epochs, args.steps_per_epoch)}


def summarize(epochs: list, steps_per_epoch: int) -> dict:
    icr = [e["icr/icr"] for e in epochs]
    mem = [e["mem/ratio"] for e in epochs]
    i_min = min(range(len(icr)), key=icr.__getitem__)
    base = mem[0]
    # onset: first epoch from which the ratio stays above max(0.05, base + 0.05)
    onset = next((i for i in range(len(mem)) if all(m > max(0.05, base + 0.05) for m in mem[i:])),
                 None)
    return {"icr_min_epoch": i_min, "icr_min": icr[i_min], "icr_first": icr[0], "icr_last": icr[-1],
            "mem_onset_epoch": onset, "mem_first": mem[0], "mem_last": mem[-1],
            "steps_per_epoch": steps_per_epoch,
            "n": int(epochs[0]["icr/n"]), "d": int(epochs[0]["icr/d"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-limited", type=int, default=200)
    p.add_argument("--n-rich", type=int, default=1600)
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--steps-per-epoch", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.995)
    p.add_argument("--icr-images", type=int, default=1024)
    p.add_argument("--d-proj", type=int, default=32)
    p.add_argument("--tap", default="middle",
                   help="MLP tap; the recorded results used 'middle' (the residual stream, mostly "
                        "the input projection); the MLP's default is now 'middle_hidden'")
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--mem-samples", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="experiments/results/icr_dynamics.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = {"args": vars(args), "runs": []}
    for n in (args.n_limited, args.n_rich):
        res = run(n, args)
        results["runs"].append(res)
        print(f"\nN = {n} ({res['seconds']:.0f} s)")
        print(f"{'epoch':>5} {'ICR':>7} {'Tr S_s':>8} {'Tr S_xi':>8} {'mem':>6}")
        for e in res["epochs"]:
            print(f"{e['epoch']:>5} {e['icr/icr']:>7.4f} {e['icr/trace_s']:>8.4f} "
                  f"{e['icr/trace_xi']:>8.4f} {e['mem/ratio']:>6.3f}")
        print("summary:", json.dumps(res["summary"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
