"""LightningCLI subclass: program name, config saving, early checks and the end-of-run summary."""
from __future__ import annotations

import math
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI


class PFDLightningCLI(LightningCLI):
    """LightningCLI for lightning_pfd (any LightningModule / LightningDataModule by class_path)."""

    def __init__(self, args=None, run: bool = True, **kwargs):
        kwargs.setdefault("parser_kwargs", {"prog": "python -m lightning_pfd"})
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        from .callbacks.wandb_setup import LogConfigCallback

        kwargs.setdefault("save_config_callback", LogConfigCallback)
        super().__init__(model_class=None, datamodule_class=None, subclass_mode_model=True,
                         subclass_mode_data=True, args=args, run=run, **kwargs)

    # -- bad configuration fails before any training ------------------------------------------
    def _check_shapes(self) -> None:
        model, dm = self.model, self.datamodule
        m_shape = getattr(model, "data_shape", None)
        d_shape = getattr(dm, "data_shape", None) if dm is not None else None
        if m_shape is None or d_shape is None:
            return
        if tuple(m_shape) != tuple(d_shape):
            raise ValueError(
                f"model.init_args.net: the net expects samples of shape {tuple(m_shape)} but "
                f"data ({type(dm).__name__}) yields shape {tuple(d_shape)}; set the net's "
                "img_resolution / in_channels (or dim) to match the data")

    def before_fit(self) -> None:
        self._check_shapes()

    def before_validate(self) -> None:
        self._check_shapes()

    def before_test(self) -> None:
        self._check_shapes()

    # -- where did everything go ---------------------------------------------------------------
    def after_fit(self) -> None:
        trainer = self.trainer
        if trainer.global_rank != 0:
            return
        lines = ["", "[lightning_pfd] run finished."]
        for lg in trainer.loggers:
            name = type(lg).__name__
            d = getattr(lg, "log_dir", None) or getattr(lg, "save_dir", None)
            if "Wandb" in name:
                try:
                    d = lg.experiment.dir.rsplit("/files", 1)[0]
                except Exception:  # pragma: no cover - depends on wandb internals
                    pass
            lines.append(f"  logs ({name}): {d}")
        ckpt = trainer.checkpoint_callback
        if ckpt is not None:
            best = getattr(ckpt, "best_model_path", "") or getattr(ckpt, "last_model_path", "")
            lines.append(f"  checkpoints: {ckpt.dirpath}" + (f" (best: {best})" if best else ""))
        plots = getattr(trainer, "lightning_pfd_plot_dirs", None)
        if plots:
            lines.append("  plots: " + ", ".join(sorted(set(map(str, plots)))))
        if any("Wandb" in type(lg).__name__ for lg in trainer.loggers):
            import os
            if os.environ.get("WANDB_MODE") == "offline":
                lines.append("  W&B ran offline (no credentials): upload later with `wandb sync <run dir>`")
        print("\n".join(lines), flush=True)
