"""Rich progress bar that shows the generalization/memorization metrics of the last evaluation.

:class:`PFDProgressBar` appends ``E_gen``, ``E_mem``, ``ICR`` and ``mem`` (memorization ratio)
to the metrics line of Lightning's ``RichProgressBar``, read from ``trainer.callback_metrics``
(so the measurement callbacks need not log with ``prog_bar=True``). Metrics not logged yet are
left out. :func:`format_pfd_metrics` is the formatting on its own (e.g. for a TQDM bar).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

from lightning.pytorch.callbacks import RichProgressBar

__all__ = ["PFDProgressBar", "format_pfd_metrics", "DEFAULT_SHOW"]

#: label shown → logged metric name.
DEFAULT_SHOW = {"E_gen": "pfd/e_gen", "E_mem": "pfd/e_mem", "ICR": "icr/icr", "mem": "mem/ratio"}


def format_pfd_metrics(metrics: Mapping, show: Optional[Mapping[str, str]] = None,
                       digits: int = 4) -> dict:
    """{label: formatted value} for the entries of ``show`` present (and finite or NaN) in
    ``metrics`` (tensors or numbers), ``digits`` significant digits."""
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
    """``RichProgressBar`` + E_gen, E_mem, ICR, memorization ratio.

    Args:
        show: label → metric name (default :data:`DEFAULT_SHOW`).
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
        self.show = dict(DEFAULT_SHOW if show is None else show)
        self.digits = digits

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.update(format_pfd_metrics(trainer.callback_metrics, self.show, self.digits))
        return items
