"""Checks of a configured run that need the instantiated trainer, made before anything is written.

Used by :meth:`lightning_pfd.launch.cli.PFDLightningCLI.validate_run` (and the sweep pre-flight
through :func:`lightning_pfd.launch.cli.check_components`):

- :func:`check_monitored_keys` — every callback's ``monitor`` (``ModelCheckpoint``,
  ``EarlyStopping``, ...) names a key that a configured monitor logs, when the key lies in the
  namespace of one of them (``pfd/e_genn`` with a GeneralizationMonitor); a key in another
  namespace (the module's ``val/loss``, a user's own callback) cannot be known before training
  and is not checked.
- :func:`check_wandb_online` — ``WANDB_MODE=online`` asked for, a W&B logger configured, but no
  credentials: refused (it would otherwise log offline without saying so).
- :func:`share_checkpoint_dir` — a checkpoint callback without ``dirpath`` (e.g. the one of an
  appended callback stack) writes into the run's checkpoint directory instead of a second one
  under the first logger's version directory.
- :func:`finished_run` — a checkpoint whose run already reached ``max_epochs`` / ``max_steps``
  (a ``fit --ckpt_path`` that has nothing to train).
"""
from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional

from ..errors import ConfigError
from .paths import callback_path

__all__ = ["check_monitored_keys", "check_wandb_online", "share_checkpoint_dir", "finished_run",
           "logged_keys"]


def logged_keys(callbacks: Iterable[Any]) -> List[str]:
    """The keys the monitors among ``callbacks`` log (their ``metric_names()``)."""
    keys = set()
    for cb in callbacks:
        names = getattr(cb, "metric_names", None)
        if callable(names):
            keys.update(str(k) for k in names())
    return sorted(keys)


def check_monitored_keys(trainer: Any) -> None:
    """ConfigError naming the callback and its ``monitor`` when the key is in the namespace of a
    configured monitor (the part before the first ``/``) but no monitor logs it; the accepted
    keys are those of that namespace (with a "did you mean")."""
    callbacks = list(getattr(trainer, "callbacks", None) or [])
    logged = logged_keys(callbacks)
    spaces = {k.split("/", 1)[0] for k in logged if "/" in k}
    for cb in callbacks:
        monitor = getattr(cb, "monitor", None)
        if not isinstance(monitor, str) or not monitor or monitor in logged or "/" not in monitor:
            continue
        space = monitor.split("/", 1)[0]
        if space in spaces:
            same = [k for k in logged if k.startswith(space + "/")]
            raise ConfigError(callback_path(cb, arg="monitor"), f"no monitor of this run logs this key (the "
                              f"{space}/* keys come from the configured monitors)", value=monitor,
                              accepted=same)


def _wandb_loggers(trainer: Any) -> list:
    try:
        from lightning.pytorch.loggers import WandbLogger
    except ImportError:  # pragma: no cover - lightning always ships it
        return []
    return [lg for lg in getattr(trainer, "loggers", None) or [] if isinstance(lg, WandbLogger)]


def check_wandb_online(trainer: Any, env: Optional[dict] = None) -> None:
    """ConfigError when ``WANDB_MODE=online`` is set, the run has a W&B logger and no W&B
    credentials exist (``WANDB_API_KEY`` or the netrc entry ``wandb login`` writes)."""
    from ..callbacks.wandb_setup import has_wandb_credentials

    env = os.environ if env is None else env
    if env.get("WANDB_MODE", "").strip().lower() != "online" or not _wandb_loggers(trainer):
        return
    if has_wandb_credentials(env):
        return
    raise ConfigError("WANDB_MODE", "online logging asked for, but no W&B credentials were found "
                      "(no WANDB_API_KEY, no netrc entry from `wandb login`)", value="online",
                      suggestion="run `wandb login` (or set WANDB_API_KEY) first; or unset WANDB_MODE "
                                 "to log offline and upload later with `wandb sync <run dir>`")


def writes_last(callback: Any) -> bool:
    """Whether a checkpoint callback writes ``last.ckpt``: ``EpochCheckpoint`` writes it itself
    (``write_last``, Lightning's own ``save_last`` off), a ``ModelCheckpoint`` by ``save_last``."""
    return bool(getattr(callback, "write_last", getattr(callback, "save_last", False)))


def share_checkpoint_dir(trainer: Any) -> List[str]:
    """Give every checkpoint callback without ``dirpath`` the directory of the run's first
    checkpoint callback that has one (Lightning would put it under the first logger's version
    directory: a second checkpoint folder). Only the first writes ``last.ckpt`` (one resume
    point per run). Returns one line per callback changed."""
    ckpts = list(getattr(trainer, "checkpoint_callbacks", None) or [])
    owner = next((cb for cb in ckpts if getattr(cb, "dirpath", None)), None)
    if owner is None:
        return []
    lines = []
    for cb in ckpts:
        if getattr(cb, "dirpath", None):
            continue
        cb.dirpath = owner.dirpath
        note = ""
        if writes_last(cb) and writes_last(owner):
            if hasattr(cb, "write_last"):
                cb.write_last = False
            else:
                cb.save_last = False
            note = " (last.ckpt is written once, by the first)"
        what = f"{type(cb).__name__}(monitor={cb.monitor!r})" if getattr(cb, "monitor", None) \
            else type(cb).__name__
        lines.append(f"{what} has no dirpath: it writes to {owner.dirpath} with the run's other "
                     f"checkpoints{note}")
    return lines


def finished_run(checkpoint: dict, max_epochs: Optional[int], max_steps: Optional[int]) -> Optional[str]:
    """Why the run of ``checkpoint`` has nothing left to train under these limits (Lightning's
    fit-loop stop rule: epochs processed >= ``max_epochs`` or global step >= ``max_steps``), or
    None. Read from the loop progress Lightning saves in the checkpoint."""
    loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    try:
        epochs = int(loop["epoch_progress"]["current"]["processed"])
    except (KeyError, TypeError, ValueError):
        epochs = None
    step = checkpoint.get("global_step")
    if max_steps is not None and max_steps != -1 and step is not None and int(step) >= max_steps:
        return f"its step {int(step)} reached trainer.max_steps={max_steps}"
    if max_epochs is not None and max_epochs != -1 and epochs is not None and epochs >= max_epochs:
        return f"its {epochs} epoch(s) reached trainer.max_epochs={max_epochs}"
    return None
