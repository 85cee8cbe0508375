"""Weights & Biases glue: offline-when-no-credentials logger, epoch x-axis and summaries, CLI config.

- :func:`has_wandb_credentials` / :func:`logger_offline_if_no_credentials` — a run goes online only
  when ``WANDB_API_KEY`` is set or a netrc entry for the W&B host exists (``wandb login`` writes
  one) and ``WANDB_MODE`` is not offline/disabled; otherwise offline (sync later with
  ``wandb sync <save_dir>/wandb/offline-run-*``). Nothing here touches the network.
- :class:`AutoWandbLogger` — ``WandbLogger`` whose ``offline`` defaults to that decision and which
  calls :func:`setup_wandb_metrics` when its run starts, with the built-in keys and those the
  trainer's callbacks declare (:func:`define_collected_keys`) (usable from YAML:
  ``class_path: lightning_pfd.callbacks.AutoWandbLogger``). :func:`default_wandb_logger` builds one.
- :func:`setup_wandb_metrics` — ``define_metric`` with ``epoch`` as x-axis for every key of a
  :class:`~lightning_pfd.keys.KeySet` (and the glob ``<group>/*`` of each family), with its
  summaries (e.g. min of ``pfd/e_gen``, ``pfd/e_mem``, ``icr/icr``, max of ``mem/ratio``, each
  also keeping ``last``). Lightning logs ``epoch`` with every call, so the axis exists in every
  history row.
- :class:`WandbMetricsSetup` — callback doing the same at setup for every ``WandbLogger``, with
  the keys collected from the trainer's callbacks (:func:`lightning_pfd.keys.collect`: monitors
  with their own namespace, user metrics).
- :class:`LogConfigCallback` — LightningCLI ``SaveConfigCallback`` that also logs the full parsed
  CLI config to every logger (W&B run config under ``cli``); pass it as ``LightningCLI(..., save_config_callback=LogConfigCallback)``.
"""
from __future__ import annotations

import netrc
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union
from urllib.parse import urlparse

from lightning.pytorch import Callback
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from .. import keys

__all__ = [
    "has_wandb_credentials",
    "logger_offline_if_no_credentials",
    "setup_wandb_metrics",
    "define_collected_keys",
    "default_wandb_logger",
    "AutoWandbLogger",
    "WandbMetricsSetup",
    "LogConfigCallback",
    "EPOCH_METRICS",
    "SUMMARIES",
]

#: Per-epoch metrics plotted against ``epoch``: the built-in keys of :mod:`lightning_pfd.keys`
EPOCH_METRICS = tuple(k.key for k in keys.all_keys())
#: Globs of the per-epoch metric families (``<group>/*``, for names not registered one by one).
EPOCH_GLOBS = tuple(f"{g}/*" for g in keys.groups())
#: W&B summaries (comma-separated, as accepted by ``define_metric(summary=...)``).
SUMMARIES = keys.summaries()

_OFFLINE_MODES = ("offline", "dryrun", "disabled")


def has_wandb_credentials(env: Optional[dict] = None) -> bool:
    """True when an API key is available without network: ``WANDB_API_KEY`` or a netrc entry
    (``$NETRC``, ``~/.netrc`` or ``~/_netrc``) for the host of ``WANDB_BASE_URL``
    (default api.wandb.ai)."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    home = Path(env.get("HOME", str(Path.home())))
    candidates = [env["NETRC"]] if env.get("NETRC") else [home / ".netrc", home / "_netrc"]
    for path in candidates:
        try:
            auth = netrc.netrc(str(path)).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            continue
        if auth and auth[2]:
            return True
    return False


def logger_offline_if_no_credentials(env: Optional[dict] = None) -> bool:
    """The ``offline`` flag to use: True if ``WANDB_MODE`` is offline/dryrun/disabled or no
    credentials exist (:func:`has_wandb_credentials`), else False."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE", "").strip().lower() in _OFFLINE_MODES:
        return True
    return not has_wandb_credentials(env)


def setup_wandb_metrics(run, *, step_metric: str = "epoch", summaries: Optional[dict] = None,
                        metrics: Optional[Sequence[str]] = None,
                        globs: Optional[Sequence[str]] = None,
                        metric_keys: Optional[keys.KeySet] = None) -> None:
    """``define_metric`` for the per-epoch metrics on a W&B ``run``: x-axis ``step_metric`` and
    the summaries of ``metric_keys`` (default :data:`lightning_pfd.keys.BUILTIN`; ``summaries``
    overrides/extends). ``metrics`` / ``globs`` default to its keys and ``<group>/*`` of their
    families. Explicit names override Lightning's ``"*" → trainer/global_step`` glob."""
    ks = keys.BUILTIN if metric_keys is None else metric_keys
    if metrics is None:
        metrics = [k.key for k in ks.all_keys()]
    if globs is None:
        globs = [f"{g}/*" for g in ks.groups()]
    summ = dict(ks.summaries(), **(summaries or {}))
    run.define_metric(step_metric)
    for g in globs:
        run.define_metric(g, step_metric=step_metric)
    for name in dict.fromkeys(list(metrics) + list(summ)):
        if name in summ:
            run.define_metric(name, step_metric=step_metric, summary=summ[name])
        else:
            run.define_metric(name, step_metric=step_metric)


#: W&B's terminal messages dropped when a run starts: ``WandbLogger`` always passes
#: ``anonymous`` to ``wandb.init``, which W&B >= 0.2x answers with a deprecation nobody can act on
KNOWN_WANDB_NOISE = ("The anonymous setting has no effect and will be removed",)


class _WandbTermRelay:
    """Fallback logger of ``wandb.termsetup`` in silent mode: prints W&B's messages on stderr as
    W&B would, except those containing one of ``drop``."""

    def __init__(self, drop: Sequence[str]):
        self.drop = tuple(drop)

    def _emit(self, msg: str) -> None:
        if not any(d in msg for d in self.drop):
            print(msg, file=sys.stderr, flush=True)

    info = warning = error = _emit


def _relay_wandb_terminal(relay: Optional[_WandbTermRelay]) -> None:
    """W&B's terminal through ``relay`` (public ``wandb.termsetup``: silent mode hands every
    message to the fallback logger), or back to the settings of W&B's own setup (None)."""
    import wandb

    if relay is None:
        wandb.termsetup(wandb.setup().settings, None)
    else:
        wandb.termsetup(wandb.Settings(silent=True), relay)


def _silent_settings():
    import wandb

    return wandb.Settings(silent=True)


#: a W&B run directory with less free space than this is full: said at once (AutoWandbLogger)
WANDB_MIN_FREE_BYTES = 16 * 2 ** 20


class AutoWandbLogger(WandbLogger):
    """``WandbLogger`` that is offline unless credentials exist (``offline=None``, the default)
    and defines the epoch x-axis and summaries (:func:`setup_wandb_metrics`) when the run
    starts. W&B's deprecation of the ``anonymous`` argument, which ``WandbLogger`` always passes,
    is dropped (:data:`KNOWN_WANDB_NOISE`), and an offline run is silent
    (``settings=wandb.Settings(silent=True)`` unless ``settings`` is given: W&B's advice to go
    online cannot work without credentials; ``fit``'s closing lines say where the run is and
    how to upload it). All other arguments are those of ``WandbLogger``."""

    def __init__(self, name: Optional[str] = None, save_dir: Union[str, Path] = ".",
                 version: Optional[str] = None, offline: Optional[bool] = None,
                 dir: Union[str, Path, None] = None, id: Optional[str] = None,
                 anonymous: Optional[bool] = None, project: Optional[str] = "lightning_pfd",
                 log_model: Union[Literal["all"], bool] = False, prefix: str = "",
                 checkpoint_name: Optional[str] = None, define_metrics: bool = True,
                 **kwargs: Any) -> None:
        if offline is None:
            offline = logger_offline_if_no_credentials()
        if offline and kwargs.get("settings") is None:  # the run's own lines ("syncing is offline", ...)
            kwargs["settings"] = _silent_settings()
        super().__init__(name=name, save_dir=save_dir, version=version, offline=offline, dir=dir,
                         id=id, anonymous=anonymous, project=project, log_model=log_model,
                         prefix=prefix, checkpoint_name=checkpoint_name, **kwargs)
        self._pfd_define_metrics = define_metrics
        self._pfd_metrics_done = False
        self._pfd_started = False
        #: (step, directory, free bytes) where the W&B directory's disk was found full, else None
        self.disk_full: Optional[tuple] = None
        #: (step, directory) when the started run's directory was found deleted
        self.run_dir_gone: Optional[tuple] = None

    def _run_dir(self) -> Optional[str]:
        """The directory W&B writes this run to (its ``files`` folder's parent), without starting
        a run."""
        d = getattr(self.experiment, "dir", None) if self._pfd_started else None  # a started run only
        return str(Path(d).parent) if isinstance(d, str) and d else (str(self.save_dir) if self.save_dir else None)

    def check_disk(self, step: Optional[int] = None) -> bool:
        """Whether the disk of the W&B run directory still has :data:`WANDB_MIN_FREE_BYTES` free
        (one ``statvfs``). The first time it has not, say so once, naming the directory and what
        keeps the rows (W&B writes its log from a background process that drops records on a
        full disk without an error in this process), and remember it in :attr:`disk_full`."""
        if self.disk_full is not None or self.run_dir_gone is not None:
            return False
        d = self._run_dir()
        if d and self._pfd_started and not os.path.isdir(d):  # deleted while the run writes to it
            self.run_dir_gone = (step, d)
            rank_zero_warn(f"W&B: the run directory {d} was deleted during the run (at step {step}): "
                           "W&B has nothing left to sync; training continues and the other loggers "
                           "(the CSV log) keep every row.", category=RuntimeWarning)
            return False
        if not d or not os.path.isdir(d):
            return True
        try:
            free = shutil.disk_usage(d).free
        except OSError:
            return True
        if free >= WANDB_MIN_FREE_BYTES:
            return True
        self.disk_full = (step, d, int(free))
        rank_zero_warn(f"W&B: the disk of {d} is full ({free / 2 ** 20:.1f} MiB free, fewer than "
                       f"{WANDB_MIN_FREE_BYTES / 2 ** 20:.0f} MiB): W&B cannot write its log from step "
                       f"{step} on, so the W&B run is incomplete from there; training continues and the "
                       "other loggers (the CSV log) keep every row. Free space there, or set the W&B "
                       "directory elsewhere (save_dir / WANDB_DIR).", category=RuntimeWarning)
        return False

    @rank_zero_only
    def log_metrics(self, metrics, step: Optional[int] = None) -> None:
        self.check_disk(step)
        super().log_metrics(metrics, step)

    @property
    def defines_metrics(self) -> bool:
        """Whether this logger defines the epoch axis and summaries (``define_metrics``)."""
        return bool(self._pfd_define_metrics)

    def log_graph(self, model, input_array=None) -> None:
        """Lightning hands every logger the module when a run starts (``Logger.log_graph``);
        through the module's trainer, define the keys its callbacks declare beyond the built-in
        ones (:func:`define_collected_keys`). W&B's ``WandbLogger`` records no graph here."""
        super().log_graph(model, input_array)
        try:
            trainer = model.trainer
        except RuntimeError:  # a module not attached to a trainer
            return
        if trainer is not None:
            define_collected_keys(trainer, loggers=[self])

    @property
    def experiment(self):
        if self._pfd_started:
            run = WandbLogger.experiment.fget(self)
        else:
            self._pfd_started = True
            _relay_wandb_terminal(_WandbTermRelay(KNOWN_WANDB_NOISE))
            try:
                run = WandbLogger.experiment.fget(self)
            finally:
                _relay_wandb_terminal(None)
        if self._pfd_define_metrics and not self._pfd_metrics_done and rank_zero_only.rank == 0:
            self._pfd_metrics_done = True
            setup_wandb_metrics(run)
        return run

    def __getstate__(self):
        state = super().__getstate__()
        state["_pfd_metrics_done"] = False
        state["_pfd_started"] = False
        return state


def default_wandb_logger(project: str = "lightning_pfd", save_dir: Union[str, Path] = ".",
                         offline: Optional[bool] = None, **kwargs: Any) -> AutoWandbLogger:
    """An :class:`AutoWandbLogger` (offline unless credentials exist)."""
    return AutoWandbLogger(project=project, save_dir=save_dir, offline=offline, **kwargs)


class WandbMetricsSetup(Callback):
    """Calls :func:`setup_wandb_metrics` on every ``WandbLogger`` of the trainer at setup
    (not needed with :class:`AutoWandbLogger`, harmless with it)."""

    def __init__(self, step_metric: str = "epoch", summaries: Optional[dict] = None) -> None:
        if not isinstance(step_metric, str) or not step_metric:
            raise ValueError(f"step_metric must be a non-empty metric name, got {step_metric!r}")
        self.step_metric = step_metric
        self.summaries = summaries

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        metric_keys = keys.collect(trainer.callbacks)
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                setup_wandb_metrics(lg.experiment, step_metric=self.step_metric,
                                    summaries=self.summaries, metric_keys=metric_keys)


class LogConfigCallback(SaveConfigCallback):
    """LightningCLI config callback: writes ``config.yaml`` as usual and logs the full parsed
    config to every logger (``log_hyperparams({"cli": config})``; for W&B it lands in the run
    config)."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if not trainer.loggers:
            return
        cfg = self.config.as_dict() if hasattr(self.config, "as_dict") else dict(self.config)
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.experiment.config.update({"cli": _plain(cfg)}, allow_val_change=True)
            else:
                lg.log_hyperparams({"cli": _plain(cfg)})


def define_collected_keys(trainer, loggers: Optional[Sequence] = None) -> None:
    """On rank 0, define the keys the trainer's callbacks declare beyond the built-in ones
    (:func:`lightning_pfd.keys.collect`) on the run of every :class:`AutoWandbLogger` (of
    ``loggers``, default the trainer's) that defines metrics (it defined the built-in ones when
    its run started)."""
    if not trainer.is_global_zero:
        return
    collected = keys.collect(trainer.callbacks)
    extra = keys.KeySet(k for k in collected.all_keys(kind=None) if k.key not in keys.BUILTIN)
    if not len(extra):
        return
    for lg in (trainer.loggers if loggers is None else loggers):
        if isinstance(lg, AutoWandbLogger) and lg.defines_metrics:
            setup_wandb_metrics(lg.experiment, metric_keys=extra)


def _plain(obj):
    """Config → JSON-friendly nested dict/list of scalars (paths and classes as strings)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
