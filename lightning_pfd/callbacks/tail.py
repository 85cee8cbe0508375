"""TailMonitor: tail metrics of a physical observable every k epochs (PITE, after the blog post
on evaluating heavy-tailed diffusion models; definitions in lightning_pfd.metrics.tails).

On every ``every_n_epochs``-th validation pass (the first always; every n-th training epoch when the
fit has no validation loop; ``_schedule.py``): ``num_samples`` seeded samples from the EMA model
(``pl_module.generate(seeds)``; seeds sharded over ranks), mapped back to physical units with
``datamodule.inverse_transform`` when it exists, reduced to one scalar per sample by the
observable (``lightning_pfd.metrics.observables``), compared with the same observable of the
training (or validation) data:

* ``tail/rmsqe``, ``tail/loader``: RMSQE (the blog's integral over [eta, 1]) and LOADER (over
  the whole real line unless ``window`` is given; density floor);
* ``tail/rmsqe_floor``, ``tail/loader_floor``: the same-law noise floors (the score of a perfect
  model with ``num_samples`` samples: random ``num_samples``-subsets of the reference vs the
  rest), computed once; the model scores use the same reference subsets and settings
  (see ``TailMonitor._metric_settings``);
* ``tail/nonfinite``: fraction of samples whose observable is NaN/inf (0.0 when all are
  finite). When it is > 0, ``tail/rmsqe`` and ``tail/loader`` are NaN: dropping the non-finite
  samples would hide exactly the largest values the tail metrics are about, and score a diverged
  model with a plausible number. Decided on the all-reduced count (every rank takes the same
  branch); one warning line the first time;
* a density plot (data vs model, log-scale density, like the blog's Fig. 9) via
  ``logger.log_image`` when available, else a PNG under ``<log_dir>/tail_density/``.

Metric states are "cat" lists of scalars, so the values are exact under DDP (see
``lightning_pfd.metrics.tails``); the reference is held by the metric, not replicated.
``name`` replaces the ``tail`` namespace of the keys (a second TailMonitor, e.g. another
observable); the checkpoint state is keyed by the measurement's arguments (``state_key``).

:meth:`TailMonitor.check_setup` refuses, before training: a module without ``generate`` (or
whose ``generate`` takes no ``num_steps`` when it is set), a missing reference split,
``num_samples`` >= the number of reference samples (the same-law floor splits the reference into
``num_samples`` stand-in generated samples and a non-empty rest), fewer samples than ranks, an
observable that does not give one value per sample, and another monitor logging the same keys.
"""
from __future__ import annotations

import inspect
import math
import os
from typing import Any, Dict, List, Optional, Sequence

import lightning.pytorch as pl
import torch

from ..errors import ConfigError
from ..metrics.observables import OBSERVABLES, get_observable
from ..metrics.tails import (LogAbsoluteDensityRatio, RootMeanSquaredQuantileError, kde_density,
                             loader_settings, same_law_floor)

from ._schedule import (ScheduledMonitor, callback_field, check_metric_prefix, check_unique_metric_names,
                        global_sum)
from .memorization import GENERATING_MODULES

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
            (window None = the whole real line: both samples plus the kernels' reach).
        num_splits: splits of the reference for the same-law floors and the matched model scores.
        batch_size, num_steps: passed to ``generate`` (num_steps only when given).
        plot: log the density plot.
        name: metric namespace (default ``"tail"``: ``tail/rmsqe``, ``tail/loader``, ...).
    """

    _DEFAULT_NAME = "tail"

    def __init__(self, every_n_epochs: int = 1, num_samples: int = 512, observable: str = "max",
                 observable_kwargs: Optional[Dict[str, Any]] = None, reference: str = "train",
                 eta: float = 0.975, window: Optional[Sequence[float]] = None, floor: float = 1e-3,
                 relative_floor: bool = True, bandwidth: Any = "silverman", num_splits: int = 8,
                 seed_offset: int = 50_000_000, batch_size: int = 256,
                 num_steps: Optional[int] = None, plot: bool = True, name: str = "tail"):
        super().__init__()
        for arg, v, lo in (("every_n_epochs", every_n_epochs, 1), ("num_samples", num_samples, 2),
                           ("num_splits", num_splits, 1), ("seed_offset", seed_offset, 0),
                           ("batch_size", batch_size, 1)):
            if isinstance(v, bool) or not float(v).is_integer() or int(v) < lo:
                raise ConfigError(callback_field(self, arg), f"must be an integer >= {lo}", value=v)
        if num_steps is not None and (isinstance(num_steps, bool) or int(num_steps) < 1):
            raise ConfigError(callback_field(self, "num_steps"), "must be None or an integer >= 1",
                              value=num_steps)
        if reference not in ("train", "val"):
            raise ConfigError(callback_field(self, "reference"), "unknown reference split",
                              value=reference, accepted=["train", "val"])
        if observable not in OBSERVABLES:
            raise ConfigError(callback_field(self, "observable"), "unknown observable", value=observable,
                              accepted=sorted(OBSERVABLES),
                              suggestion=None if _close(observable) else
                              "register your own with lightning_pfd.metrics.observables.register_observable")
        if not 0.0 < float(eta) < 1.0:
            raise ConfigError(callback_field(self, "eta"), "the RMSQE tail level must lie in (0, 1)",
                              value=eta)
        self.name = check_metric_prefix(self, "name", name)
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
        self._window_arg = self.window  # None: the whole real line (LOADER's own support rule)
        self.floor, self.relative_floor, self.bandwidth = float(floor), bool(relative_floor), bandwidth
        self.num_splits, self.seed_offset = int(num_splits), int(seed_offset)
        self.batch_size, self.num_steps, self.plot = int(batch_size), num_steps, bool(plot)
        self.history: list = []
        self.floors: Dict[str, float] = {}
        self._ref: Optional[torch.Tensor] = None
        self.last_samples_obs: Optional[torch.Tensor] = None

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # a new run may bring new data: forget what was derived from the old reference (a resumed
        # run gets window / floors back from its checkpoint, restored after setup)
        self._ref, self.window, self.floors = None, self._window_arg, {}
        super().setup(trainer, pl_module, stage)  # + check_setup at fit / validate

    # ------------------------------------------------------------------ names, state key, checks
    def key(self, leaf: str) -> str:
        """Logged name of ``leaf`` (rmsqe, loader, rmsqe_floor, loader_floor, nonfinite)."""
        return f"{self.name}/{leaf}"

    def metric_names(self) -> List[str]:
        return [self.key(leaf) for leaf in ("rmsqe", "loader", "rmsqe_floor", "loader_floor",
                                            "nonfinite", "density")]

    @property
    def state_key(self) -> str:
        """Built from the arguments that define the measurement (namespace, observable,
        reference, samples, eta): several monitors keep and resume their own state."""
        return self._generate_state_key(name=self.name, observable=self.observable_name,
                                        observable_kwargs=self.observable_kwargs,
                                        reference=self.reference, num_samples=self.num_samples,
                                        eta=self.eta, seed_offset=self.seed_offset)

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", datamodule: Any) -> None:
        """Raise :class:`ConfigError` for what cannot work with this model / data / Trainer
        (module docstring); evaluates the observable on two reference samples only."""
        self._check_module(pl_module)
        data = self._reference_data(datamodule)
        n_ref = int(len(data))
        if not self.num_samples < n_ref:  # the same-law floor's requirement: n_gen in [1, n_ref - 1]
            raise ConfigError(callback_field(self, "num_samples"),
                              f"the same-law floors split the {n_ref} {self.reference} samples into "
                              f"num_samples stand-in generated samples and a non-empty rest, so "
                              f"num_samples must be smaller than {n_ref}", value=self.num_samples,
                              accepted=f"an integer in [{math.floor(1 / (1 - self.eta)) + 1}, {n_ref - 1}]",
                              suggestion=f"lower num_samples or use more {self.reference} data")
        if self.num_samples < trainer.world_size:
            raise ConfigError(callback_field(self, "num_samples"), f"every rank needs at least one "
                              f"sample (world size {trainer.world_size})", value=self.num_samples)
        check_unique_metric_names(self, trainer)
        self._check_observable(datamodule, data)

    def _check_module(self, pl_module) -> None:
        gen = getattr(pl_module, "generate", None)
        if not callable(gen):
            raise ConfigError("model", f"TailMonitor samples with generate(seeds); {type(pl_module).__name__} "
                              "has no generate method", value=type(pl_module).__name__,
                              accepted=GENERATING_MODULES)
        if self.num_steps is not None:
            params = inspect.signature(gen).parameters
            if "num_steps" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
                raise ConfigError(callback_field(self, "num_steps"), f"{type(pl_module).__name__}.generate "
                                  "takes no num_steps", value=self.num_steps, accepted=[None])

    def _reference_data(self, dm) -> torch.Tensor:
        data = getattr(dm, f"{self.reference}_data", None) if dm is not None else None
        if data is None or len(data) == 0:
            raise ConfigError(callback_field(self, "reference"), f"the datamodule has no "
                              f"{self.reference}_data after setup()", value=self.reference,
                              accepted=[r for r in ("train", "val")
                                        if getattr(dm, f"{r}_data", None) is not None])
        return data

    def _check_observable(self, dm, data: torch.Tensor) -> None:
        try:
            obs = self.observable(self._inverse(dm, data[:2]))
        except Exception as e:  # e.g. an observable written for other data
            raise ConfigError(callback_field(self, "observable"), f"fails on samples of shape "
                              f"{tuple(data.shape[1:])}: {type(e).__name__}: {e}",
                              value=self.observable_name) from e
        if tuple(torch.as_tensor(obs).shape) != (min(2, len(data)),):
            raise ConfigError(callback_field(self, "observable"), "must give one scalar per sample; got "
                              f"shape {tuple(torch.as_tensor(obs).shape)} for 2 samples",
                              value=self.observable_name)

    # ------------------------------------------------------------------ reference
    @staticmethod
    def _inverse(dm, x: torch.Tensor) -> torch.Tensor:
        inv = getattr(dm, "inverse_transform", None)
        return (inv(x) if inv is not None else x).to(torch.float64)

    def reference_observable(self, trainer) -> torch.Tensor:
        """Observable of the reference data in physical units (float64, CPU), cached."""
        if self._ref is None:
            dm = trainer.datamodule
            data = self._reference_data(dm)
            obs = torch.cat([self.observable(self._inverse(dm, c)) for c in data.split(1024)])
            self._ref = obs.cpu().to(torch.float64)
        return self._ref

    def _loader_kwargs(self) -> dict:
        return dict(window=self.window, floor=self.floor, relative_floor=self.relative_floor,
                    bandwidth=self.bandwidth)

    def _metric_settings(self, ref: torch.Tensor) -> Dict[str, dict]:
        """Explicit settings shared by the model scores and the same-law floors.

        **[choice]** Model and floor are compared on identical terms (docs/levy.md): the
        floor is the mean of metric(ref[S_k], ref[R_k]) over ``num_splits`` seeded splits
        (|S_k| = n_gen = ``num_samples``, drawn without replacement; R_k the other
        n_ref - n_gen points) and the model score is the mean of metric(gen, ref[R_k]) over
        the *same* R_k (``matched_score``), so a perfect model's expected score equals the
        floor; scoring against the full reference instead would leave a reference-size
        mismatch (n_ref vs n_ref - n_gen). RMSQE integrates up to u = 1 (the blog's
        definition); LOADER uses the bandwidth and absolute density floor frozen on the full
        reference (``loader_settings``) and its window rule. Needs ``num_samples`` < n_ref.
        """
        n_ref = int(ref.numel())
        if not self.num_samples < n_ref:
            raise ConfigError(callback_field(self, "num_samples"), f"must be < the number of reference "
                              f"samples ({n_ref}) for the same-law floor (n_gen = num_samples)",
                              value=self.num_samples, accepted=f"an integer in [2, {n_ref - 1}]")
        return {"rmsqe": dict(eta=self.eta),
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
        """rmsqe, loader (NaN when any sample's observable is non-finite), nonfinite and the
        floors; every rank must call it (synced metrics, one all-reduced count)."""
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
        n_bad = global_sum(float((~finite).sum()), world, pl_module.device)
        out = {"rmsqe": math.nan, "loader": math.nan} if n_bad > 0 else self._scores(ref, obs, pl_module.device)
        out["nonfinite"] = n_bad / self.num_samples
        out.update(self._floors(ref))
        self.last_samples_obs = obs[finite] if world == 1 else None
        if self.plot and trainer.is_global_zero and world == 1:
            self._plot(trainer, ref, obs[finite])
        return out

    def _scores(self, ref: torch.Tensor, obs: torch.Tensor, device) -> Dict[str, float]:
        """Model scores with the floors' reference splits and settings (all ranks call compute)."""
        st = self._metric_settings(ref)  # same settings and reference splits as the floors
        rm = RootMeanSquaredQuantileError(reference=ref, **st["rmsqe"],
                                          **self._split_kwargs()).to(device)
        ld = LogAbsoluteDensityRatio(reference=ref, **st["loader"], **self._split_kwargs()).to(device)
        out = {}
        for name, m in (("rmsqe", rm), ("loader", ld)):
            m.update(obs)
            out[name] = float(m.compute())  # every rank sees the same gathered state
        return out

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        vals = self.measure(trainer, pl_module)
        self._warn_nonfinite(trainer, vals["nonfinite"], "sample observables",
                             [self.key("rmsqe"), self.key("loader")], self.key("nonfinite"))
        for k, v in vals.items():
            pl_module.log(self.key(k), torch.tensor(v, dtype=torch.float32), sync_dist=False)
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
                logger.log_image(key=self.key("density"), images=[img], step=trainer.global_step)
            else:
                root = (getattr(logger, "log_dir", None) if logger is not None else None) \
                    or trainer.default_root_dir
                out = os.path.join(root, f"{self.name}_density")
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


def _close(name: str) -> bool:
    """Whether a registered observable name is close to ``name`` (ConfigError then suggests it)."""
    from ..errors import did_you_mean

    return did_you_mean(name, OBSERVABLES) is not None
