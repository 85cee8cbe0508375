"""What callbacks send to the loggers outside ``pl_module.log``: figures and direct metrics.

:func:`log_figure` logs a figure on rank 0: a W&B image with a ``WandbLogger`` (any logger with
``log_image``), ``add_figure`` / ``add_image`` with a ``TensorBoardLogger``, else a PNG
``figures/<key>-epoch<k>.png`` under the logger's ``log_dir`` or the trainer's
``default_root_dir`` (:func:`figure_dir`); the figure is closed. :func:`log_to_loggers` logs
metrics from hooks where ``pl_module.log`` is not allowed (e.g. ``on_validation_end``).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import lightning.pytorch as pl
import torch

from ..keys import slug

__all__ = ["figure_to_array", "figure_dir", "log_figure", "log_to_loggers"]


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


def logged_epoch(trainer: "pl.Trainer") -> int:
    """The epoch a row belongs to: the one running, or after the fit loop ended (``on_fit_end``,
    where ``current_epoch`` already counts the last epoch as completed) the last one trained:
    started epochs − 1 (``current_epoch`` where the loop's progress is not available)."""
    try:
        started = int(trainer.fit_loop.epoch_progress.current.started)
    except (AttributeError, TypeError, ValueError):
        return int(trainer.current_epoch)
    return max(0, started - 1)


def log_to_loggers(trainer: "pl.Trainer", metrics: Mapping[str, float]) -> None:
    """Log ``metrics`` where ``pl_module.log`` is not allowed (e.g. ``on_validation_end``):
    into ``trainer.callback_metrics`` on every rank (float64 tensors) and, on rank 0, to every
    logger with the epoch (:func:`logged_epoch`, an integer as Lightning logs it) at
    ``trainer.global_step``."""
    for k, v in metrics.items():
        trainer.callback_metrics[k] = torch.tensor(float(v), dtype=torch.float64)
    if not trainer.is_global_zero:
        return
    payload = dict(metrics, epoch=logged_epoch(trainer))
    for lg in trainer.loggers:
        lg.log_metrics(payload, step=trainer.global_step)
