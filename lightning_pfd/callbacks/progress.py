"""Rich progress bar that shows the generalization/memorization metrics of the last evaluation.

:class:`PFDProgressBar` appends the metrics registered with ``progress_bar=True`` in
:mod:`lightning_pfd.keys` (built in: ``E_gen``, ``E_mem``, ``ICR`` and ``mem``, the memorization
ratio; a user metric registered there appears too) to the metrics line of Lightning's
``RichProgressBar``, read from ``trainer.callback_metrics`` (so the measurement callbacks need not
log with ``prog_bar=True``). Metrics not logged yet are left out. :func:`format_pfd_metrics` is
the formatting on its own (e.g. for a TQDM bar).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

from lightning.pytorch.callbacks import RichProgressBar

from .. import keys

__all__ = ["PFDProgressBar", "format_pfd_metrics", "DEFAULT_SHOW"]

#: label shown → logged metric name, of the built-in keys
DEFAULT_SHOW = keys.progress_bar_keys()


def format_pfd_metrics(metrics: Mapping, show: Optional[Mapping[str, str]] = None,
                       digits: int = 4) -> dict:
    """{label: formatted value} for the entries of ``show`` (default: the built-in progress-bar
    keys, :data:`DEFAULT_SHOW`) present (and finite or NaN) in ``metrics`` (tensors or numbers),
    ``digits`` significant digits."""
    out = {}
    for label, key in (DEFAULT_SHOW if show is None else show).items():
        v = metrics.get(key)
        if v is None:
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        out[label] = f"{f:.{digits}g}" if math.isfinite(f) or math.isnan(f) else str(f)
    return out


class PFDProgressBar(RichProgressBar):
    """``RichProgressBar`` + the progress-bar metrics (E_gen, E_mem, ICR, memorization ratio and
    any key with ``progress_bar=True`` that a callback of the trainer declares).

    Args:
        show: label → metric name (default: the keys collected from the trainer's callbacks at
            setup, :func:`lightning_pfd.keys.collect`; the built-in ones before).
        digits: significant digits.
        **kwargs: ``RichProgressBar`` arguments (refresh_rate, leave, theme, console_kwargs).
    """

    def __init__(self, show: Optional[dict] = None, digits: int = 4, **kwargs) -> None:
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 12:
            raise ValueError(f"digits must be an integer in [1, 12], got {digits!r}")
        if show is not None and not all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in show.items()):
            raise ValueError("show must map labels (str) to logged metric names (str)")
        super().__init__(**kwargs)
        self._show = None if show is None else dict(show)
        self._collected = keys.BUILTIN
        self.digits = digits

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._collected = keys.collect(trainer.callbacks)

    @staticmethod
    def on_terminal() -> bool:
        """Whether rich draws a live bar here (a terminal, or rich's FORCE_TERMINAL); on a pipe or
        a log file it draws nothing until the end, so :meth:`on_train_epoch_end` prints a line."""
        from rich.console import Console

        return bool(Console().is_terminal)

    def epoch_line(self, trainer) -> str:
        """One plain line for an epoch: its number, its validation loss and the shown metrics (the
        epoch's training-loss mean is logged after the callbacks' epoch end: not known yet)."""
        last = trainer.max_epochs - 1 if trainer.max_epochs not in (None, -1) else None
        parts = [f"[lightning_pfd] epoch {trainer.current_epoch}" + (f"/{last}" if last is not None else "")]
        loss = format_pfd_metrics(trainer.callback_metrics, {"val/loss": "val/loss"}, self.digits)
        shown = dict(loss, **format_pfd_metrics(trainer.callback_metrics, self.show, self.digits))
        return "  ".join(parts + [f"{k} {v}" for k, v in shown.items()])

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if trainer.is_global_zero and not self.on_terminal():
            print(self.epoch_line(trainer), flush=True)

    @property
    def show(self) -> dict:
        """label → metric name shown (the collected progress-bar keys unless given)."""
        return self._collected.progress_bar_keys() if self._show is None else dict(self._show)

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.update(format_pfd_metrics(trainer.callback_metrics, self.show, self.digits))
        return items
