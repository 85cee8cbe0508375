"""When the measurement callbacks measure: every n-th validation pass (the first one always).

Lightning validates only at epochs with ``(epoch + 1) % check_val_every_n_epoch == 0`` (or several
times per epoch with ``val_check_interval < 1``), so a test on ``current_epoch % every_n_epochs``
can miss every validation pass. :class:`MeasurementSchedule` counts the passes instead (sanity
checks excluded) and keeps the count in the callback's ``state_dict``, so a resumed run keeps its
cadence. A fit without a validation loop (no ``validation_step`` / ``val_dataloader``,
``limit_val_batches=0``, or an empty validation set) never calls ``on_validation_epoch_end``:
:class:`ScheduledMonitor` then counts training epochs in ``on_train_epoch_end`` instead.

Outside ``fit`` (``trainer.validate``) every pass measures and the count does not move.

Shared by the monitors as well (:class:`ScheduledMonitor`):

* ``check_setup(trainer, pl_module, datamodule)``: every incompatibility a monitor can detect
  without heavy work, raised as :class:`~lightning_pfd.errors.ConfigError`. The command line calls
  it for every callback before any logger directory, config file, checkpoint or cache is written;
  ``setup`` calls it again at the start of ``fit`` / ``validate`` for Python-API users.
* non-finite measurements: :func:`global_sum` all-reduces a count so that every rank takes the same
  branch (no rank waits in a collective the others skipped), :meth:`ScheduledMonitor._warn_nonfinite`
  prints one warning line (rank 0) the first time a fit produces NaN/inf.
* metric names: ``metric_names()`` lists the keys a monitor logs; :func:`check_unique_metric_names`
  refuses two monitors that would write the same key.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from ..errors import ConfigError

__all__ = ["MeasurementSchedule", "ScheduledMonitor", "validation_disabled", "callback_field",
           "global_sum", "check_unique_metric_names", "check_metric_prefix", "require_train_data",
           "SIGMA_SPACE_MODULES"]

#: what the sigma-space monitors (PFD, ICR) accept as a LightningModule, for error messages
SIGMA_SPACE_MODULES = ("lightning_pfd.modules.DiffusionModule (precond 'edm' or 'vp'), or any "
                       "LightningModule exposing a sigma-space EMA denoiser `denoiser`")


def callback_field(callback: Any, arg: str) -> str:
    """The config path of a callback argument, e.g. ``trainer.callbacks[ICRMonitor].tap``."""
    return f"trainer.callbacks[{type(callback).__name__}].{arg}"


def global_sum(value: float, world_size: int = 1, device: Any = None) -> float:
    """``value`` summed over all ranks (float64 all-reduce; the identity on one process).

    Every rank must call it (it is a collective when ``world_size > 1``). ``device`` is where the
    buffer lives (the module's device: NCCL needs a GPU tensor).
    """
    if world_size <= 1:
        return float(value)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t)


def require_train_data(callback: Any, datamodule: Any) -> torch.Tensor:
    """``datamodule.train_data`` (the shared datamodule contract, after ``setup``), non-empty.

    ``callback`` is the asking callback (or a string naming the asker)."""
    who = callback if isinstance(callback, str) else type(callback).__name__
    data = getattr(datamodule, "train_data", None) if datamodule is not None else None
    if data is None:
        raise ConfigError("data", f"{who} needs a datamodule exposing `train_data` "
                          "after setup()", suggestion="pass datamodule=... to trainer.fit (every "
                          "lightning_pfd datamodule exposes train_data)")
    if len(data) == 0:
        raise ConfigError("data", "the training set is empty", value=tuple(data.shape))
    return data


def check_metric_prefix(callback: Any, arg: str, prefix: Any) -> str:
    """A metric namespace: a non-empty string without '/' (the keys are ``<prefix>/<name>``)."""
    if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix != prefix.strip():
        raise ConfigError(callback_field(callback, arg), "must be a non-empty metric namespace "
                          "without '/' or surrounding spaces", value=prefix,
                          accepted="e.g. 'icr' or 'icr_sigma1'")
    return prefix


def check_unique_metric_names(callback: Any, trainer: "pl.Trainer", arg: str = "name") -> None:
    """Refuse another callback of the trainer that logs one of ``callback.metric_names()``."""
    mine = set(callback.metric_names())
    for other in getattr(trainer, "callbacks", None) or []:
        if other is callback or not callable(getattr(other, "metric_names", None)):
            continue
        shared = sorted(mine & set(other.metric_names()))
        if shared:
            raise ConfigError(
                callback_field(callback, arg),
                f"another callback of the Trainer ({type(other).__name__}) also logs {shared[:3]} "
                "(two monitors writing one key overwrite each other's curve)",
                value=getattr(callback, arg, None),
                suggestion=f"give one of them a different `{arg}` (its metric namespace)")


def validation_disabled(trainer: "pl.Trainer") -> bool:
    """True when this run has no validation loop, i.e. ``on_validation_epoch_end`` never fires."""
    if not trainer.enable_validation:  # no val data / validation_step, or limit_val_batches == 0
        return True
    nv = trainer.num_val_batches  # [] until the validation loop set its data up (then known)
    return bool(nv) and sum(nv) == 0


class MeasurementSchedule:
    """Counter of measurement opportunities ("passes"); due on every ``every_n``-th, from the first.

    Attributes:
        passes: passes counted so far this fit (saved in the owner's ``state_dict``).
        index: the index of the latest pass (0-based; -1 before any).
        fresh: whether the latest pass was due (read by :class:`ICREarlyStopping`).
    """

    def __init__(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def due(self, trainer: "pl.Trainer", every_n: int) -> bool:
        """Count one pass and say whether to measure in it. Call exactly once per pass."""
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != TrainerFn.FITTING:  # an explicit trainer.validate(): always measure
            self.index, self.fresh = self.passes, True
            return True
        self.index, self.fresh = self.passes, self.passes % every_n == 0
        self.passes += 1
        return self.fresh

    def reset(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def state_dict(self) -> Dict[str, Any]:
        return {"passes": self.passes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.passes = int(state.get("passes", 0))


class ScheduledMonitor(Callback):
    """Base of the monitors: calls ``self._measure_and_log(trainer, pl_module)`` on schedule.

    Subclasses set ``self.every_n_epochs`` (read at every pass) and implement
    ``_measure_and_log``; their ``state_dict`` should include ``schedule_state()`` and their
    ``load_state_dict`` call ``load_schedule_state(state)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.schedule = MeasurementSchedule()
        self._warned_nonfinite = False

    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        raise NotImplementedError

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                    datamodule: Any) -> None:
        """Raise :class:`ConfigError` for what this monitor can tell is incompatible (cheaply)."""

    def metric_names(self) -> List[str]:
        """The keys this monitor logs (used to refuse two monitors writing the same key)."""
        return []

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # setup() runs before a checkpoint's callback state is restored: a fresh fit starts its
        # count at 0 (first pass measured), a resumed one gets the saved count back afterwards
        if stage == "fit":
            self.schedule.reset()
            self._warned_nonfinite = False
        if stage in ("fit", "validate"):  # datamodule.setup() has run: train_data exists
            self.check_setup(trainer, pl_module, getattr(trainer, "datamodule", None))

    def _warn_nonfinite(self, trainer: "pl.Trainer", fraction: float, what: str,
                        nan_keys: List[str], fraction_key: str) -> None:
        """One warning line (rank 0), the first time this fit measures non-finite values."""
        if fraction <= 0 or self._warned_nonfinite:
            return
        self._warned_nonfinite = True
        rank_zero_warn(f"{type(self).__name__}: non-finite {what}: {100 * fraction:.3g}% are NaN/inf "
                       f"at epoch {trainer.current_epoch} (diverged model?); logging NaN for "
                       f"{', '.join(nan_keys)} and the fraction as {fraction_key} (warned once)",
                       category=RuntimeWarning)

    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # without a validation loop Lightning never calls on_validation_epoch_end: measure here
        if validation_disabled(trainer) and self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    #: the metric namespace (``name``) of a monitor created without one
    _DEFAULT_NAME: Optional[str] = None

    def on_load_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint: Dict[str, Any]) -> None:
        """Adopt the state of a checkpoint written before ``state_key`` existed (saved under the
        class name), if this monitor uses the default namespace: that is the one it came from.
        Lightning then passes the same dict to ``load_state_dict``."""
        states = checkpoint.get("callbacks") or {}
        legacy = type(self).__qualname__
        if (self.state_key not in states and legacy in states and legacy != self.state_key
                and getattr(self, "name", None) == self._DEFAULT_NAME):
            states[self.state_key] = states[legacy]

    def schedule_state(self) -> Dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_schedule_state(self, state_dict: Dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict.get("schedule", {}))
