"""Benchmark: GeneralizationMonitor per-epoch cost vs the bare cost of M x 35 student forward passes.

The first validation builds (and caches) the teacher and empirical endpoints; later epochs must
only pay for the student's Heun-18 flow (35 network evaluations per seed), the descriptor, the
PFD sums and the frozen-noise losses. We time ``on_validation_epoch_end`` of a second
``trainer.validate`` (caches warm) against 35 plain forward passes of the EMA denoiser on M
inputs in the same batch size, and report the ratio (target <= 1.2x), plus the cold first epoch.

    python benchmarks/pfd_monitor_overhead.py --m 1024 --dim 64 --hidden 256 --depth 4

(``benchmarks/run.py`` measures the same on the quickstart's configuration, interleaved with the
other monitors, for the table in benchmarks/results.md.)
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import lightning.pytorch as pl
import torch

from lightning_pfd.callbacks import GeneralizationMonitor
from lightning_pfd.data import TensorDataModule
from lightning_pfd.diffusion import GaussianDenoiser
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet


class Timing(pl.Callback):
    """Times a GeneralizationMonitor (an EvaluationMonitor): its references, prepared at the start
    of each validation (computed cold, then read from the disk cache), and its
    ``on_validation_epoch_end`` (the per-epoch measurement). Listed before the monitor."""

    def __init__(self, monitor):
        self.monitor, self.epoch_seconds, self.prepare_seconds = monitor, [], []
        measure = monitor.on_validation_epoch_end

        def timed(trainer, pl_module):
            t = time.perf_counter()
            measure(trainer, pl_module)
            self.epoch_seconds.append(time.perf_counter() - t)
        monitor.on_validation_epoch_end = timed

    def on_validation_start(self, trainer, pl_module):
        t = time.perf_counter()
        self.monitor.prepare(trainer, pl_module)  # binds the data, computes / loads the references
        self.prepare_seconds.append(time.perf_counter() - t)


class TeacherDM(TensorDataModule):
    def __init__(self, teacher, n_train, n_val):
        super().__init__(train_data=teacher.sample(range(n_train)).float(),
                         val_data=teacher.sample(range(10**6, 10**6 + n_val)).float(), batch_size=256,
                         value_range=None)
        self._teacher = teacher

    def setup(self, stage=None):
        super().setup(stage)
        self.teacher = self._teacher


def bare_forward_seconds(den, m, dim, batch_size, nfe=35):
    x = torch.randn(m, dim)
    sig = torch.tensor(1.0)
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(nfe):
            for b in x.split(batch_size):
                den(b, sig)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--n-train", type=int, default=1024)
    ap.add_argument("--n-val", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--num-loss-samples", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="warm epochs / bare runs; the best is reported")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("LIGHTNING_PFD_CACHE", tempfile.mkdtemp(prefix="pfd_bench_cache_"))
    g = torch.Generator().manual_seed(0)
    A = torch.randn(args.dim, args.dim, generator=g, dtype=torch.float64)
    teacher = GaussianDenoiser(torch.zeros(args.dim), A @ A.T / args.dim + 0.05 * torch.eye(args.dim))
    dm = TeacherDM(teacher, args.n_train, args.n_val)
    torch.manual_seed(0)
    model = DiffusionModule(MLPNet(args.dim, hidden=args.hidden, depth=args.depth), family="vp")
    cb = GeneralizationMonitor(num_eval=args.m, batch_size=args.batch_size, num_loss_samples=args.num_loss_samples,
                               image_every_n_epochs=0)
    timing = Timing(cb)
    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, limit_val_batches=1)
    for _ in range(1 + args.rounds):  # first: cold (builds the caches); then warm
        pl.Trainer(callbacks=[timing, cb], **kw).validate(model, datamodule=dm, verbose=False)
        # a new run (its setup forgets the evaluation's data): the references are read again,
        # from the disk cache the second time
    bare = min(bare_forward_seconds(model.denoiser, args.m, args.dim, args.batch_size) for _ in range(args.rounds))
    cold, warm = timing.epoch_seconds[0] + timing.prepare_seconds[0], min(timing.epoch_seconds[1:])
    print(f"M={args.m}, MLPNet(dim={args.dim}, hidden={args.hidden}, depth={args.depth}), VP student, "
          f"{args.threads} thread(s); loss samples {args.num_loss_samples} train + {args.num_loss_samples} val")
    print(f"bare M x 35 forward passes: {bare:.3f} s")
    print(f"monitor epoch (warm cache, best of {args.rounds}):  {warm:.3f} s  -> ratio {warm / bare:.2f}x")
    print(f"loading cached references:   {timing.prepare_seconds[1]:.3f} s (once per run)")
    print(f"first epoch (cold, teacher + empirical flows computed and cached): {cold:.3f} s "
          f"-> ratio {cold / bare:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
