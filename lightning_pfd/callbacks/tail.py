"""TailMonitor: tail metrics of a physical observable every k epochs (PITE; REFERENCE §13).

On every ``every_n_epochs``-th validation pass (the first always; every n-th training epoch when the
fit has no validation loop; ``_schedule.py``): ``num_samples`` seeded samples from the EMA model
(``pl_module.generate(seeds)``; seeds sharded over ranks), mapped back to physical units with
``datamodule.inverse_transform`` when it exists, reduced to one scalar per sample by the
observable (``lightning_pfd.metrics.observables``), compared with the same observable of the
training (or validation) data:

* ``tail/rmsqe``, ``tail/loader``: RMSQE (eta) and LOADER (fixed window, density floor);
* ``tail/rmsqe_floor``, ``tail/loader_floor``: the same-law noise floors (the score of a perfect
  model with ``num_samples`` samples: random ``num_samples``-subsets of the reference vs the
  rest), computed once; the model scores use the same reference subsets and settings
  (see ``TailMonitor._metric_settings``);
* ``tail/nonfinite``: fraction of samples whose observable is NaN/inf (dropped before the
  metrics);
* a density plot (data vs model, log-scale density, like the blog's Fig. 9) via
  ``logger.log_image`` when available, else a PNG under ``<log_dir>/tail_density/``.

Metric states are "cat" lists of scalars, so the values are exact under DDP (see
``lightning_pfd.metrics.tails``); the reference is held by the metric, not replicated.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence

import lightning.pytorch as pl
import torch

from ..metrics.observables import get_observable
from ..metrics.tails import (LogAbsoluteDensityRatio, RootMeanSquaredQuantileError, kde_density,
                             loader_settings, same_law_floor)

from ._schedule import ScheduledMonitor

__all__ = ["TailMonitor"]


class TailMonitor(ScheduledMonitor):
    """Tail metrics of ``observable`` between model samples and data (see module docstring).

    Args:
        every_n_epochs: evaluate on every n-th validation pass (the first always), or every n-th
            training epoch when the fit has no validation loop.
        num_samples: generated samples per evaluation (seeds ``seed_offset + i``).
        observable, observable_kwargs: registered observable name and its keyword arguments.
        reference: "train" or "val" data as the reference sample.
        eta: RMSQE tail level. window, floor, relative_floor, bandwidth: LOADER settings
            (window None = range of the reference observable, fixed for the whole run).
        num_splits: splits of the reference for the same-law floors and the matched model scores.
        batch_size, num_steps: passed to ``generate`` (num_steps only when given).
        plot: log the density plot.
    """

    def __init__(self, every_n_epochs: int = 1, num_samples: int = 512, observable: str = "max",
                 observable_kwargs: Optional[Dict[str, Any]] = None, reference: str = "train",
                 eta: float = 0.975, window: Optional[Sequence[float]] = None, floor: float = 1e-3,
                 relative_floor: bool = True, bandwidth: Any = "silverman", num_splits: int = 8,
                 seed_offset: int = 50_000_000, batch_size: int = 256,
                 num_steps: Optional[int] = None, plot: bool = True):
        super().__init__()
        if int(every_n_epochs) < 1:
            raise ValueError(f"every_n_epochs: must be >= 1, got {every_n_epochs}")
        if int(num_samples) < 2:
            raise ValueError(f"num_samples: must be >= 2, got {num_samples}")
        if reference not in ("train", "val"):
            raise ValueError(f"reference: must be 'train' or 'val', got {reference!r}")
        if int(seed_offset) < 0:
            raise ValueError(f"seed_offset: must be >= 0, got {seed_offset}")
        self.observable_name = observable
        self.observable_kwargs = dict(observable_kwargs or {})
        self.observable = get_observable(observable, **self.observable_kwargs)  # validates name
        # validate metric settings now (before any training)
        RootMeanSquaredQuantileError(eta=eta)
        LogAbsoluteDensityRatio(window=window, floor=floor, relative_floor=relative_floor,
                                bandwidth=bandwidth)
        self.every_n_epochs, self.num_samples = int(every_n_epochs), int(num_samples)
        self.reference, self.eta = reference, float(eta)
        self.window = None if window is None else tuple(float(v) for v in window)
        self._window_arg = self.window  # None: the reference's range, re-derived for every new run
        self.floor, self.relative_floor, self.bandwidth = float(floor), bool(relative_floor), bandwidth
        self.num_splits, self.seed_offset = int(num_splits), int(seed_offset)
        self.batch_size, self.num_steps, self.plot = int(batch_size), num_steps, bool(plot)
        self.history: list = []
        self.floors: Dict[str, float] = {}
        self._ref: Optional[torch.Tensor] = None
        self.last_samples_obs: Optional[torch.Tensor] = None

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # a new run may bring new data: forget what was derived from the old reference (a resumed
        # run gets window / floors back from its checkpoint, restored after setup)
        self._ref, self.window, self.floors = None, self._window_arg, {}

    # ------------------------------------------------------------------ reference
    @staticmethod
    def _inverse(dm, x: torch.Tensor) -> torch.Tensor:
        inv = getattr(dm, "inverse_transform", None)
        return (inv(x) if inv is not None else x).to(torch.float64)

    def reference_observable(self, trainer) -> torch.Tensor:
        """Observable of the reference data in physical units (float64, CPU), cached."""
        if self._ref is None:
            dm = trainer.datamodule
            if dm is None:
                raise ValueError("TailMonitor: needs a datamodule with train_data / val_data")
            data = dm.train_data if self.reference == "train" else dm.val_data
            if data is None:
                raise ValueError(f"reference: the datamodule has no {self.reference}_data")
            obs = torch.cat([self.observable(self._inverse(dm, c)) for c in data.split(1024)])
            self._ref = obs.cpu().to(torch.float64)
            if self.window is None:
                self.window = (float(self._ref.min()), float(self._ref.max()))
        return self._ref

    def _loader_kwargs(self) -> dict:
        return dict(window=self.window, floor=self.floor, relative_floor=self.relative_floor,
                    bandwidth=self.bandwidth)

    def _metric_settings(self, ref: torch.Tensor) -> Dict[str, dict]:
        """Explicit settings shared by the model scores and the same-law floors.

        **[choice]** Model and floor are compared on identical terms (REFERENCE §13): the
        floor is the mean of metric(ref[S_k], ref[R_k]) over ``num_splits`` seeded splits
        (|S_k| = n_gen = ``num_samples``, drawn without replacement; R_k the other
        n_ref - n_gen points) and the model score is the mean of metric(gen, ref[R_k]) over
        the *same* R_k (``matched_score``), so a perfect model's expected score equals the
        floor; scoring against the full reference instead would leave a reference-size
        mismatch (n_ref vs n_ref - n_gen). RMSQE uses the explicit u_max = 1 - 1/n_gen;
        LOADER the window, bandwidth and absolute density floor frozen on the full reference
        (``loader_settings``). Needs ``num_samples`` < n_ref.
        """
        n_ref = int(ref.numel())
        if not self.num_samples < n_ref:
            raise ValueError(f"num_samples: must be < the number of reference samples ({n_ref}) "
                             f"for the same-law floor (n_gen = num_samples), got {self.num_samples}")
        return {"rmsqe": dict(eta=self.eta, u_max=1.0 - 1.0 / self.num_samples),
                "loader": loader_settings(ref, **self._loader_kwargs())}

    def _split_kwargs(self) -> dict:
        return dict(num_splits=self.num_splits, n_gen=self.num_samples, split_seed=0)

    def _floors(self, ref: torch.Tensor) -> Dict[str, float]:
        if not self.floors:
            st, n = self._metric_settings(ref), self.num_samples
            self.floors = {
                "loader_floor": float(same_law_floor(ref, "loader", self.num_splits, 0, n,
                                                     **st["loader"])),
                "rmsqe_floor": float(same_law_floor(ref, "rmsqe", self.num_splits, 0, n,
                                                    **st["rmsqe"])),
            }
        return self.floors

    # ------------------------------------------------------------------ evaluation
    def measure(self, trainer, pl_module) -> Dict[str, float]:
        ref = self.reference_observable(trainer)
        rank, world = trainer.global_rank, max(1, trainer.world_size)
        seeds = torch.arange(self.seed_offset, self.seed_offset + self.num_samples)[rank::world]
        kw = {"batch_size": self.batch_size}
        if self.num_steps is not None:
            kw["num_steps"] = int(self.num_steps)
        with torch.no_grad():
            x = pl_module.generate(seeds, **kw)
        obs = self.observable(self._inverse(trainer.datamodule, x)).detach().cpu()
        finite = torch.isfinite(obs)
        device = pl_module.device
        st = self._metric_settings(ref)  # same settings and reference splits as the floors
        rm = RootMeanSquaredQuantileError(reference=ref, **st["rmsqe"],
                                          **self._split_kwargs()).to(device)
        ld = LogAbsoluteDensityRatio(reference=ref, **st["loader"], **self._split_kwargs()).to(device)
        n_bad = torch.tensor([float((~finite).sum())], dtype=torch.float64, device=device)
        for m in (rm, ld):
            m.update(obs[finite])
        out = {}
        for name, m in (("rmsqe", rm), ("loader", ld)):
            try:  # every rank calls compute (syncs); all see the same gathered state
                out[name] = float(m.compute())
            except ValueError:  # e.g. every sample non-finite, or too few for eta
                out[name] = float("nan")
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(n_bad)
        out["nonfinite"] = float(n_bad) / self.num_samples
        out.update(self._floors(ref))
        self.last_samples_obs = obs[finite] if world == 1 else None
        if self.plot and trainer.is_global_zero and world == 1:
            self._plot(trainer, ref, obs[finite])
        return out

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        vals = self.measure(trainer, pl_module)
        for k, v in vals.items():
            pl_module.log(f"tail/{k}", torch.tensor(v, dtype=torch.float32), sync_dist=False)
        self.history.append({"epoch": trainer.current_epoch, "step": trainer.global_step, **vals})

    # ------------------------------------------------------------------ plot (blog Fig. 9)
    def density_figure(self, ref: torch.Tensor, gen: torch.Tensor, title: str = ""):
        """Matplotlib figure: KDE densities of data and model observables, log-scale density."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        import numpy as np

        lo = float(min(ref.min(), gen.min() if gen.numel() else ref.min()))
        hi = float(max(ref.max(), gen.max() if gen.numel() else ref.max()))
        from ..metrics.tails import _bandwidth

        hi = min(hi, float(ref.max()) + 2.0 * float(ref.max() - ref.min()))  # cut wild outliers
        xs = np.linspace(lo, hi, 512)
        bw = _bandwidth(ref.numpy(), self.bandwidth)  # one bandwidth, as in LOADER
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(xs, kde_density(ref, xs, bw), label="data", color="C0")
        if gen.numel() >= 2:
            ax.plot(xs, kde_density(gen, xs, bw), label="model", color="C1")
        ax.set_yscale("log")
        peak = float(kde_density(ref, xs, bw).max())
        ax.set_ylim(peak * 1e-5, peak * 3)
        if self.window is not None:
            ax.axvspan(*self.window, color="0.9", zorder=0, label="LOADER window")
        ax.set_xlabel(f"observable: {self.observable_name}")
        ax.set_ylabel("density (KDE)")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        return fig

    def _plot(self, trainer, ref: torch.Tensor, gen: torch.Tensor) -> None:
        import matplotlib.pyplot as plt

        fig = self.density_figure(ref, gen, f"epoch {trainer.current_epoch}")
        logger = trainer.logger
        try:
            if logger is not None and hasattr(logger, "log_image"):
                import numpy as np

                fig.canvas.draw()
                img = np.asarray(fig.canvas.buffer_rgba())[..., :3]
                logger.log_image(key="tail/density", images=[img], step=trainer.global_step)
            else:
                root = (getattr(logger, "log_dir", None) if logger is not None else None) \
                    or trainer.default_root_dir
                out = os.path.join(root, "tail_density")
                os.makedirs(out, exist_ok=True)
                fig.savefig(os.path.join(out, f"epoch_{trainer.current_epoch:04d}.png"), dpi=100)
        finally:
            plt.close(fig)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> Dict[str, Any]:
        return {"history": list(self.history), "floors": dict(self.floors),
                "window": None if self.window is None else list(self.window), **self.schedule_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.floors = dict(state_dict.get("floors", {}))
        self.load_schedule_state(state_dict)
        w = state_dict.get("window")
        self.window = None if w is None else tuple(w)

    @property
    def last(self) -> Dict[str, float]:
        return self.history[-1] if self.history else {}
