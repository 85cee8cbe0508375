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
