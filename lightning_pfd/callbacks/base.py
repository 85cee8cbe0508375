"""The base of every measurement callback: *when* to measure and *where* to log.

The package's monitors are :class:`~lightning_pfd.callbacks.monitor.EvaluationMonitor`, which runs
any evaluation of the measurement contract (:mod:`lightning_pfd.evaluation.base`) on this base.
A monitor of another shape subclasses :class:`MeasurementCallback`, implements
``_measure_and_log(trainer, pl_module)`` (measure with an evaluation object, then
:meth:`~MeasurementCallback.log_metrics` / :meth:`~MeasurementCallback.log_figure`) and lists its
distinguishing arguments in ``_state_key_args()``. The base provides:

**Schedule.** Measurements happen at *passes*: validation passes of ``fit`` (sanity checks
excluded; several per epoch with ``val_check_interval < 1``), or training epochs when the fit has
no validation loop (no ``validation_step`` / ``val_dataloader``, ``limit_val_batches=0``, an empty
validation set: Lightning then never calls ``on_validation_epoch_end``). Counting passes rather
than testing ``current_epoch % n`` matters: Lightning validates only at epochs with ``(epoch + 1) %
check_val_every_n_epoch == 0``, which an epoch test can miss every time. Pass ``i`` (0-based) is
measured when

- ``schedule="every_n_epochs"`` (default): ``i % every_n_epochs == 0``;
- ``schedule="log"``: ``i`` is in :func:`log_schedule`, i.e. ``i = 0`` or ``i = round(√2^k)``
  for an integer ``k >= 0`` (round half up; duplicates dropped): 0, 1, 2, 3, 4, 6, 8, 11, 16,
  23, 32, 45, 64, 91, 128, 181, 256, 362, 512, … — about two measurements per doubling of the
  pass count, dense where early learning happens and sparse over a long double descent (18
  measurements in 500 passes); ``every_n_epochs`` is ignored;
- ``schedule=[i0, i1, ...]``: exactly the listed pass indices (integers >= 0, no duplicates, any
  order); ``every_n_epochs`` is ignored.

With validation every epoch (the default) or no validation loop, pass ``i`` is epoch ``i``. The
pass count is saved in ``state_dict``, so a resumed run continues the same sequence. Outside
``fit`` (an explicit ``trainer.validate``) every pass measures and the count does not move.

**State.** ``history`` (one dict per measurement: epoch, step and the logged values) and the pass
count are kept in ``state_dict`` (subclass extras via ``_extra_state`` / ``_load_extra_state``);
``state_key`` is built from ``_state_key_args()`` in Lightning's ``_generate_state_key`` format
(the format of the checkpoints written before this base existed), so several monitors of one
class that measure different things keep and resume their own state.

**Processes.** :meth:`shard`, :meth:`gather`, :meth:`all_sum` and :meth:`all_true` are those of
the trainer's :class:`~lightning_pfd.evaluation.base.Comm` (``trainer.strategy``'s public
``all_gather`` / ``reduce``, :func:`~lightning_pfd.evaluation.base.strategy_comm`); all are the
identity on one process and, with several, must be called by every rank.

**Logging.** :meth:`log_metrics` (one ``pl_module.log_dict`` per epoch + a history row) and
:func:`log_figure` (a W&B image with a ``WandbLogger``, ``add_figure`` / ``add_image`` with a
``TensorBoardLogger``, else a PNG ``figures/<key>-epoch<k>.png`` under the logger's ``log_dir`` or
the trainer's ``default_root_dir``; rank 0 only; the figure is closed). Callbacks that are not
monitors (``RegimeMonitor``) use the module functions :func:`log_figure` and
:func:`log_to_loggers` (for hooks where ``pl_module.log`` is not allowed).

**Checks.** ``check_setup(trainer, pl_module, datamodule)``: every incompatibility a monitor can
detect cheaply, raised as :class:`~lightning_pfd.errors.ConfigError`. The command line calls it for
every callback before any directory, config, checkpoint or cache is written; ``setup`` calls it
again at the start of ``fit`` / ``validate`` for Python-API users. ``metric_names()`` lists the
logged keys (:func:`check_unique_metric_names` refuses two monitors writing one key);
:meth:`_warn_nonfinite` prints one warning line the first time a fit measures NaN/inf.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from ..analysis.per_unit import STORE_DIR, PerUnitStore, UnitRecord
from ..errors import ConfigError
from ..evaluation.base import strategy_comm
from ..keys import slug
from .state import callback_state_key

__all__ = ["MeasurementCallback", "MeasurementSchedule", "log_schedule", "is_log_pass",
           "check_schedule", "SCHEDULES", "validation_disabled", "callback_field",
           "check_unique_metric_names", "check_metric_prefix", "require_train_data",
           "figure_to_array", "figure_dir", "log_figure", "log_to_loggers"]

#: the named schedules (an explicit list of pass indices is the third form)
SCHEDULES = ("every_n_epochs", "log")

ScheduleSpec = Union[str, Sequence[int]]


# ----------------------------------------------------------------------------- small helpers
def callback_field(callback: Any, arg: str) -> str:
    """The config path of a callback argument, e.g. ``trainer.callbacks[ICRMonitor].tap``."""
    return f"trainer.callbacks[{type(callback).__name__}].{arg}"


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


# ----------------------------------------------------------------------------- schedules
def _log_pass(k: int) -> int:
    """round(√2^k), round half up (√2^k is an integer for even k, irrational for odd k)."""
    return int(math.floor(math.sqrt(2.0) ** k + 0.5)) if k % 2 else 2 ** (k // 2)


def log_schedule(limit: int) -> List[int]:
    """The ``"log"`` schedule's pass indices below ``limit``: 0 and round(√2^k), k = 0, 1, …
    (deduplicated, increasing)."""
    out, k = [0] if limit > 0 else [], 0
    while True:
        i = _log_pass(k)
        if i >= limit:
            return out
        if i != out[-1]:
            out.append(i)
        k += 1


def is_log_pass(index: int) -> bool:
    """Whether pass ``index`` is in the ``"log"`` schedule."""
    if index < 0:
        return False
    if index == 0:
        return True
    k = max(0, int(2 * math.log2(index)) - 2)  # round(√2^k) ≈ index near k = 2·log2(index)
    while _log_pass(k) <= index:
        if _log_pass(k) == index:
            return True
        k += 1
    return False


def check_schedule(owner: Any, schedule: Any, every_n_epochs: Any) -> Tuple[Union[str, Tuple[int, ...]], int]:
    """Validate ``schedule`` / ``every_n_epochs`` of ``owner`` (a callback, for the field names):
    ``(schedule, every_n_epochs)`` with an explicit list as a sorted tuple; else ConfigError."""
    if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
        raise ConfigError(callback_field(owner, "every_n_epochs"), "must be an integer >= 1",
                          value=every_n_epochs, accepted="an integer >= 1")
    accepted = "'every_n_epochs', 'log', or a list of pass indices (integers >= 0)"
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ConfigError(callback_field(owner, "schedule"), "unknown schedule", value=schedule,
                              accepted=list(SCHEDULES),
                              suggestion=None if schedule.strip() else accepted)
        return schedule, every_n_epochs
    if isinstance(schedule, (list, tuple)):
        if not schedule:
            raise ConfigError(callback_field(owner, "schedule"), "an explicit schedule needs at "
                              "least one pass index", value=list(schedule), accepted=accepted)
        bad = [i for i in schedule if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ConfigError(callback_field(owner, "schedule"), f"pass indices must be integers "
                              f">= 0, got {bad[:3]}", value=list(schedule), accepted=accepted)
        dup = sorted({i for i in schedule if list(schedule).count(i) > 1})
        if dup:
            raise ConfigError(callback_field(owner, "schedule"), f"pass indices listed twice: "
                              f"{dup[:3]}", value=list(schedule), accepted=accepted)
        return tuple(sorted(schedule)), every_n_epochs
    raise ConfigError(callback_field(owner, "schedule"), "must be a schedule name or a list",
                      value=schedule, accepted=accepted)


class MeasurementSchedule:
    """Counter of measurement opportunities ("passes") and the rule that picks the measured ones.

    Args:
        kind: ``"every_n_epochs"``, ``"log"`` or a tuple of pass indices (validated by
            :func:`check_schedule`).

    Attributes:
        passes: passes counted so far this fit (saved in the owner's ``state_dict``).
        index: the index of the latest pass (0-based; -1 before any).
        fresh: whether the latest pass was due (read by :class:`ICREarlyStopping`).
    """

    def __init__(self, kind: Union[str, Tuple[int, ...]] = "every_n_epochs") -> None:
        self.kind = kind
        self._listed = frozenset(kind) if isinstance(kind, tuple) else None
        self.passes, self.index, self.fresh = 0, -1, False

    def is_due(self, index: int, every_n: int = 1) -> bool:
        """Whether pass ``index`` is measured (``every_n``: for ``"every_n_epochs"``)."""
        if self._listed is not None:
            return index in self._listed
        if self.kind == "log":
            return is_log_pass(index)
        return index % every_n == 0

    def due(self, trainer: "pl.Trainer", every_n: int = 1) -> bool:
        """Count one pass and say whether to measure in it. Call exactly once per pass."""
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != TrainerFn.FITTING:  # an explicit trainer.validate(): always measure
            self.index, self.fresh = self.passes, True
            return True
        self.index, self.fresh = self.passes, self.is_due(self.passes, every_n)
        self.passes += 1
        return self.fresh

    def reset(self) -> None:
        self.passes, self.index, self.fresh = 0, -1, False

    def state_dict(self) -> Dict[str, Any]:
        return {"passes": self.passes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.passes = int(state.get("passes", 0))


# ----------------------------------------------------------------------------- figures
def figure_to_array(figure: Any):
    """An image as a numpy array (H, W) or (H, W, 3): a matplotlib figure is rendered (Agg),
    a tensor / array is returned as numpy."""
    import numpy as np

    if hasattr(figure, "savefig"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = figure.canvas if hasattr(figure.canvas, "buffer_rgba") else FigureCanvasAgg(figure)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()
    if isinstance(figure, torch.Tensor):
        figure = figure.detach().cpu().numpy()
    return np.asarray(figure)


def _close(figure: Any) -> None:
    if hasattr(figure, "savefig"):
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        plt.close(figure)


def _save_png(figure: Any, path: str) -> None:
    if hasattr(figure, "savefig"):
        figure.savefig(path, dpi=100)
        return
    import matplotlib.image as mpimg
    import numpy as np

    img = figure_to_array(figure)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.dtype == np.uint8:
        mpimg.imsave(path, img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
    else:
        mpimg.imsave(path, np.clip(img, 0.0, 1.0), cmap="gray" if img.ndim == 2 else None,
                     vmin=0.0, vmax=1.0)


def _is_path(figure: Any) -> bool:
    return isinstance(figure, (str, os.PathLike))


def figure_dir(trainer: "pl.Trainer") -> str:
    """Where PNG figures go without an image logger: ``<log_dir>/figures`` (the first logger
    with a ``log_dir``, else the trainer's ``default_root_dir``). No collective (unlike
    ``trainer.log_dir``), so rank 0 may call it alone."""
    root = next((d for d in (getattr(lg, "log_dir", None) for lg in trainer.loggers) if d),
                None) or trainer.default_root_dir
    return os.path.join(root, "figures")


def _tensorboard_image(logger: Any, key: str, figure: Any, step: int) -> None:
    if hasattr(figure, "savefig"):
        logger.experiment.add_figure(key, figure, global_step=step, close=False)
        return
    if _is_path(figure):
        import matplotlib.image as mpimg

        figure = mpimg.imread(os.fspath(figure))[..., :3]
    img = figure_to_array(figure)
    logger.experiment.add_image(key, img, global_step=step,
                                dataformats="HW" if img.ndim == 2 else "HWC")


def log_figure(trainer: "pl.Trainer", key: str, figure: Any,
               caption: Optional[str] = None) -> Optional[str]:
    """Log a figure under ``key`` on rank 0 (the one path for every callback).

    ``figure``: a matplotlib figure, an image array / tensor (H, W[, C]; uint8, or float in
    [0, 1]) or the path of a PNG already written. Every logger with ``log_image`` (W&B) gets an
    image, a ``TensorBoardLogger`` ``add_figure`` / ``add_image``; without such a logger the
    image is saved as ``figure_dir(trainer)/<key>-epoch<k>.png`` (``/`` in the key → ``_``; a
    given PNG path stays where it is). Returns the PNG path (None when only loggers received
    it or on other ranks). A matplotlib figure is closed in every case."""
    try:
        if not trainer.is_global_zero:
            return None
        from lightning.pytorch.loggers import TensorBoardLogger

        logged = False
        for lg in trainer.loggers:
            if hasattr(lg, "log_image"):
                kw = {"caption": [caption]} if caption else {}
                image = os.fspath(figure) if _is_path(figure) else figure_to_array(figure)
                lg.log_image(key=key, images=[image], step=trainer.global_step, **kw)
                logged = True
            elif isinstance(lg, TensorBoardLogger):
                _tensorboard_image(lg, key, figure, trainer.global_step)
                logged = True
        if _is_path(figure):
            return os.fspath(figure)
        if logged:
            return None
        out = figure_dir(trainer)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"{slug(key)}-epoch{int(trainer.current_epoch):04d}.png")
        _save_png(figure, path)
        return path
    finally:
        _close(figure)


def log_to_loggers(trainer: "pl.Trainer", metrics: Mapping[str, float]) -> None:
    """Log ``metrics`` where ``pl_module.log`` is not allowed (e.g. ``on_validation_end``):
    into ``trainer.callback_metrics`` on every rank (float64 tensors) and, on rank 0, to every
    logger with the current ``epoch`` at ``trainer.global_step``."""
    for k, v in metrics.items():
        trainer.callback_metrics[k] = torch.tensor(float(v), dtype=torch.float64)
    if not trainer.is_global_zero:
        return
    payload = dict(metrics, epoch=float(trainer.current_epoch))
    for lg in trainer.loggers:
        lg.log_metrics(payload, step=trainer.global_step)


# ----------------------------------------------------------------------------- per-unit records
_PREPARED_STORES: Dict[int, str] = {}


def per_unit_store(trainer: "pl.Trainer") -> PerUnitStore:
    """The run's per-unit records: ``<trainer.default_root_dir>/per_unit``
    (:mod:`lightning_pfd.analysis.per_unit`). The first call of a fresh fit (no ``ckpt_path``)
    moves the records of an earlier run in that directory aside (``per_unit.prev-<time>``, on
    rank 0) so the two runs are never mixed; a resumed fit keeps and extends them."""
    root = Path(trainer.default_root_dir) / STORE_DIR
    if _PREPARED_STORES.get(id(trainer)) != str(root):
        _PREPARED_STORES[id(trainer)] = str(root)
        fresh = getattr(trainer, "ckpt_path", None) is None and getattr(trainer.state, "fn", None) == TrainerFn.FITTING
        if fresh and trainer.is_global_zero and root.is_dir() and any(root.glob("*/epoch_*.npz")):
            stem = f"{STORE_DIR}.prev-{time.strftime('%Y%m%d-%H%M%S')}"
            k = 0
            while root.with_name(f"{stem}-{k}").exists():
                k += 1
            root.rename(root.with_name(f"{stem}-{k}"))
    return PerUnitStore(root)


# ----------------------------------------------------------------------------- the base
class MeasurementCallback(Callback):
    """Base of the monitors: calls ``self._measure_and_log(trainer, pl_module)`` on schedule.

    Args:
        every_n_epochs: with ``schedule="every_n_epochs"``, measure on every n-th pass (the
            first always). Subclasses may also set ``self.every_n_epochs`` themselves (it is read
            at every pass).
        schedule: ``"every_n_epochs"`` (default), ``"log"`` or a list of pass indices (module
            docstring).

    Subclasses implement ``_measure_and_log`` and, when several instances may coexist,
    ``_state_key_args()`` (the arguments that distinguish what they measure) and
    ``metric_names()``; extra checkpoint state via ``_extra_state`` / ``_load_extra_state``.
    """

    #: the metric namespace (``name``) of a monitor created without one
    _DEFAULT_NAME: Optional[str] = None

    def __init__(self, every_n_epochs: int = 1, schedule: ScheduleSpec = "every_n_epochs") -> None:
        super().__init__()
        kind, self.every_n_epochs = check_schedule(self, schedule, every_n_epochs)
        self.schedule = MeasurementSchedule(kind)
        self.history: List[Dict[str, Any]] = []
        self._warned_nonfinite = False

    # ------------------------------------------------------------------ what subclasses provide
    def _measure_and_log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        raise NotImplementedError

    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                    datamodule: Any) -> None:
        """Raise :class:`ConfigError` for what this monitor can tell is incompatible (cheaply)."""

    def metric_names(self) -> List[str]:
        """The keys this monitor logs (used to refuse two monitors writing the same key)."""
        return []

    def _state_key_args(self) -> Dict[str, Any]:
        """The arguments that define what this monitor measures (not the operational ones)."""
        return {}

    def _extra_state(self) -> Dict[str, Any]:
        """Subclass state saved next to the history and the pass count."""
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""

    # ------------------------------------------------------------------ schedule hooks
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # setup() runs before a checkpoint's callback state is restored: a fresh fit starts its
        # count at 0 (first pass measured), a resumed one gets the saved count back afterwards
        if stage == "fit":
            self.schedule.reset()
            self._warned_nonfinite = False
        if stage in ("fit", "validate"):  # datamodule.setup() has run: train_data exists
            self.check_setup(trainer, pl_module, getattr(trainer, "datamodule", None))

    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # without a validation loop Lightning never calls on_validation_epoch_end: measure here
        if validation_disabled(trainer) and self.schedule.due(trainer, self.every_n_epochs):
            self._measure_and_log(trainer, pl_module)

    # ------------------------------------------------------------------ processes
    # (the trainer's Comm, lightning_pfd.evaluation.base.strategy_comm: every rank must call them)
    @staticmethod
    def shard(n_or_items: Any, trainer: "pl.Trainer"):
        """This rank's part: ``arange(rank, n, world)`` for an integer ``n``, else
        ``items[rank::world]`` (a tensor's rows or a sequence)."""
        return strategy_comm(trainer).shard(n_or_items)

    @staticmethod
    def gather(rows: torch.Tensor, trainer: "pl.Trainer", n: Optional[int] = None) -> torch.Tensor:
        """All rows in the global order, from this rank's strided shard (``trainer.strategy``
        all-gather; every rank must call it). ``n``: the global row count (gathered when None)."""
        comm = strategy_comm(trainer)
        if comm.world == 1:
            return rows
        if n is None:
            count = torch.tensor([rows.shape[0]], dtype=torch.long, device=rows.device)
            n = int(torch.stack(comm.all_gather_equal(count)).sum())
        return comm.gather_rows(rows, n)

    @staticmethod
    def all_sum(value: Any, trainer: "pl.Trainer") -> float:
        """``value`` summed over ranks (float64, ``trainer.strategy.reduce``; every rank calls it)."""
        comm = strategy_comm(trainer)
        if comm.world == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=trainer.strategy.root_device)
        return float(comm.reduce_sum(t))

    @classmethod
    def all_true(cls, flag: bool, trainer: "pl.Trainer") -> bool:
        """``flag`` on every rank (a sum of the failures; every rank calls it)."""
        return cls.all_sum(0.0 if flag else 1.0, trainer) == 0.0

    # ------------------------------------------------------------------ logging
    def log_metrics(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                    values: Mapping[str, Any], extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Log ``values`` once per epoch on every logger (one ``pl_module.log_dict``, no sync: the
        values are already global) and append a history row ``{"epoch", "step", **values, **extra}``.
        Numbers are logged as float32 tensors, tensors as they are. Returns the row."""
        payload = {key: v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float32)
                   for key, v in values.items()}
        pl_module.log_dict(payload, sync_dist=False, on_step=False, on_epoch=True, batch_size=1)
        row = {"epoch": int(trainer.current_epoch), "step": int(trainer.global_step),
               **{k: float(v) for k, v in values.items()}, **dict(extra or {})}
        self.history.append(row)
        return row

    def write_units(self, trainer: "pl.Trainer", key: str, kind: str, values: Any, units: Any,
                    value: float) -> None:
        """Keep this epoch's per-unit values of ``key`` (rank 0; the values are already global):
        :class:`~lightning_pfd.analysis.per_unit.UnitRecord` in :func:`per_unit_store`."""
        store = per_unit_store(trainer)
        if not trainer.is_global_zero:
            return
        as_np = (lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t)
        store.write(UnitRecord(key, int(trainer.current_epoch), int(trainer.global_step), kind,
                               as_np(values), as_np(units), float(value)))

    def log_figure(self, trainer: "pl.Trainer", key: str, figure: Any,
                   caption: Optional[str] = None) -> Optional[str]:
        """:func:`log_figure` (W&B image, TensorBoard, else ``figures/<key>-epoch<k>.png``)."""
        return log_figure(trainer, key, figure, caption)

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

    # ------------------------------------------------------------------ checkpoint state
    @property
    def state_key(self) -> str:
        """``ClassName{args}`` from :meth:`_state_key_args` (the class name alone without args)."""
        args = self._state_key_args()
        return callback_state_key(self, **args) if args else type(self).__qualname__

    def state_dict(self) -> Dict[str, Any]:
        return {"history": list(self.history), **self.schedule_state(), **self._extra_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
        self._load_extra_state(state_dict)

    def schedule_state(self) -> Dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_schedule_state(self, state_dict: Dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict.get("schedule", {}))
