"""Fault injection for the reliability tests (importable by class_path from a CLI subprocess)."""
from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class KillAtStep(Callback):
    """SIGKILL this process right after optimizer step ``step`` (no state, no cleanup: a crash)."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAtStep(Callback):
    """Send ``signum`` (default SIGTERM) to this process right after optimizer step ``step``: what a
    scheduler or Ctrl+C does, through the real signal handlers."""

    def __init__(self, step: int, signum: int = int(signal.SIGTERM)):
        self.step, self.signum = int(step), int(signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class StepClock(Callback):
    """Lightning's ``Timer`` (``trainer.max_time``) reads ``time.monotonic()``; while this callback
    is set up, its clock reads the optimizer step instead (one second per step), so a
    ``max_time`` stop lands at a chosen step on any machine, however slow."""

    def setup(self, trainer, pl_module, stage) -> None:
        import lightning.pytorch.callbacks.timer as timer

        class _Clock:
            @staticmethod
            def monotonic() -> float:
                return float(trainer.global_step)

        self._timer, self._saved = timer, timer.time
        timer.time = _Clock

    def teardown(self, trainer, pl_module, stage) -> None:
        saved = getattr(self, "_saved", None)
        if saved is not None:
            self._timer.time, self._saved = saved, None


class ScaleWeightsAtStep(Callback):
    """Multiply every trained weight by ``factor`` right after optimizer step ``step``: a finite
    explosion (the loss jumps by orders of magnitude and stays finite), the kind a non-finite
    check alone misses."""

    def __init__(self, step: int, factor: float):
        self.step, self.factor = int(step), float(factor)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import torch

            with torch.no_grad():
                for p in pl_module.trained_module.parameters():
                    p.mul_(self.factor)


class ScaleWeightsAtEpochEnd(Callback):
    """Multiply every trained weight by ``factor`` at the end of training epoch ``epoch`` (before
    the module's own end-of-epoch hooks): weights that exploded between two checks."""

    def __init__(self, epoch: int, factor: float):
        self.epoch, self.factor = int(epoch), float(factor)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            import torch

            with torch.no_grad():
                for p in pl_module.trained_module.parameters():
                    p.mul_(self.factor)


class DeadNetAtStep(Callback):
    """Right after optimizer step ``step``, set every weight matrix of the trained network and of
    its EMA copy to 0 and every bias to 1: its hidden features are the same for every input (a
    collapsed network), though still finite."""

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import torch

            with torch.no_grad():
                for module in (pl_module.trained_module, pl_module.ema.shadow):
                    for name, p in module.named_parameters():
                        p.fill_(1.0 if name.endswith("bias") else 0.0)
