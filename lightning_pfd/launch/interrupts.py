"""SIGTERM / SIGINT during a command: stop cleanly, say what can be resumed, exit non-zero.

What a scheduler (SLURM, Kubernetes, ``timeout``) or Ctrl+C sends must not read as success.
Lightning 2.6 turns SIGTERM into :class:`lightning.pytorch.utilities.exceptions.SIGTERMException`
at the next batch boundary (a ``SystemExit`` *without* a code: exit status 0) and Ctrl+C into
``sys.exit(1)``, after calling every callback's ``on_exception`` and finalizing the loggers.
:func:`signal_guard` records which signal arrived (Lightning chains the SIGTERM handler that was
installed before it, so the record is kept while the trainer runs) and the command then returns
``128 + signum``: **143** for SIGTERM, **130** for SIGINT, the shell convention.

What is resumable is the last checkpoint written at an epoch end (``last.ckpt``:
:class:`lightning_pfd.callbacks.EpochCheckpoint` never overwrites it with a half-finished epoch,
so a resume reproduces the uninterrupted run); the batches after it are recomputed. The message
names that checkpoint, its epoch and the command that resumes it.

Outside the trainer (while the data loads, before the first batch) a SIGTERM stops the command
at once, as the default action would, with the same exit status.
"""
from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

__all__ = ["SignalRecord", "signal_guard", "interrupt_status", "resume_message", "SIGNAL_EXIT",
           "report_rebuild_line"]

#: the exit status of a command stopped by a signal (128 + signal number)
SIGNAL_EXIT = {signal.SIGTERM: 128 + int(signal.SIGTERM), signal.SIGINT: 128 + int(signal.SIGINT)}


class SignalRecord:
    """Which signal (if any) arrived while :func:`signal_guard` was active."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum) if self.signum is not None else 0


@contextlib.contextmanager
def signal_guard() -> Iterator[SignalRecord]:
    """Record SIGTERM / SIGINT for the duration of the block (restoring the previous handlers).

    SIGTERM: recorded; when no trainer has chained this handler (``signal.getsignal`` still
    returns it), ``SystemExit(143)`` is raised at once. SIGINT: recorded, then KeyboardInterrupt
    as Python's default handler does (Lightning stops the trainer on it). Only in the main thread
    (``signal.signal`` refuses elsewhere); in another thread the block runs unguarded."""
    record = SignalRecord()
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield record
        return

    def on_term(signum, frame):
        first = record.signum is None
        record.signum = int(signum)
        if signal.getsignal(signal.SIGTERM) is on_term and first:  # no trainer running: stop now
            raise SystemExit(SIGNAL_EXIT[signal.SIGTERM])

    def on_int(signum, frame):
        record.signum = int(signum)
        raise KeyboardInterrupt

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_int)
    try:
        yield record
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _last_checkpoint(trainer) -> Optional[Path]:
    """The newest ``last*.ckpt`` in the trainer's checkpoint directories (None: none written)."""
    found: List[Path] = []
    for cb in getattr(trainer, "checkpoint_callbacks", []) or []:
        d = getattr(cb, "dirpath", None)
        if d and Path(d).is_dir():
            found += [p for p in Path(d).glob("last*.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _resume_command(argv: Sequence[str], prog: str) -> str:
    """``argv`` with ``--ckpt_path last`` (an earlier ``--ckpt_path`` replaced)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--ckpt_path":
            skip = True
            continue
        if a.startswith("--ckpt_path="):
            continue
        out.append(a)
    return " ".join([prog, *map(shlex.quote, out), "--ckpt_path", "last"])


def resume_message(record: SignalRecord, trainer, argv: Sequence[str], prog: str) -> str:
    """What stopped the run, what is kept and how to continue (several lines)."""
    where = ""
    if trainer is not None:
        where = f" in epoch {trainer.current_epoch} (step {trainer.global_step})"
    lines = [f"[lightning_pfd] stopped by {record.name}{where}; exit status {record.exit_status}."]
    fitting = bool(argv) and argv[0] == "fit"
    ckpt = _last_checkpoint(trainer) if trainer is not None else None
    finished = _finished(ckpt, trainer) if ckpt is not None else None
    if finished is not None:  # the stop came after the last epoch (in the end-of-run report)
        lines.append(f"  training had finished: {ckpt} is the final checkpoint ({finished}); "
                     "nothing is left to resume")
    elif ckpt is not None:
        epoch = _checkpoint_epoch(ckpt)
        at = f" (end of epoch {epoch})" if epoch is not None else ""
        lines.append(f"  resumable: {ckpt}{at}; the batches after it are recomputed on resume "
                     "(the same numbers as an uninterrupted run)")
        if fitting:
            lines.append(f"  resume with: {_resume_command(argv, prog)}")
    elif fitting:
        done = int(getattr(trainer, "current_epoch", 0) or 0) if trainer is not None else 0
        if done > 0:  # epochs ended, but no callback wrote a last*.ckpt at their end
            why = (f"{done} epoch(s) finished, but no checkpoint callback wrote a last*.ckpt at an "
                   "epoch end (use lightning_pfd.callbacks.EpochCheckpoint, or ModelCheckpoint with "
                   "save_top_k != 0)")
        else:
            why = "the first epoch did not finish"
        lines.append(f"  nothing to resume: no checkpoint was written yet ({why}); run the same "
                     "command again to start over")
    rebuild = report_rebuild_line(trainer, prog) if fitting else None
    if rebuild:
        lines.append(rebuild)
    return "\n".join(lines)


def report_rebuild_line(trainer, prog: str) -> Optional[str]:
    """For a run whose RegimeMonitor writes the end-of-run report: how to (re)build it from the
    logs, since a stop before or during that report leaves it missing or partial."""
    if trainer is None or not any(getattr(cb, "write_report", False) and hasattr(cb, "report_dir")
                                  for cb in getattr(trainer, "callbacks", []) or []):
        return None
    run = getattr(trainer, "default_root_dir", None) or "RUN_DIR"
    return (f"  report: the end-of-run report may be missing or partial; build it from the logs "
            f"with: {prog} report {shlex.quote(str(run))}")


def missing_report_line(trainer, prog: str, since: float) -> Optional[str]:
    """For a finished run (``fit`` has nothing to train) whose RegimeMonitor writes the end-of-run
    report: a line saying it is missing and how to build it, when no ``report.md`` written after
    ``since`` (the final checkpoint's mtime) is found in a monitor's ``report_dir``, under the
    trainer's root directory or a logger's ``save_dir`` (a SIGKILL during the report)."""
    monitors = [cb for cb in getattr(trainer, "callbacks", []) or []
                if getattr(cb, "write_report", False) and hasattr(cb, "report_dir")]
    if not monitors:
        return None
    roots = {Path(cb.report_dir) for cb in monitors if cb.report_dir}
    roots.add(Path(getattr(trainer, "default_root_dir", None) or "."))
    roots.update(Path(lg.save_dir) for lg in getattr(trainer, "loggers", []) or []
                 if isinstance(getattr(lg, "save_dir", None), str))
    for root in roots:
        found = [root / "report.md"] if (root / "report.md").is_file() else []
        found += list(root.rglob("report/report.md")) if root.is_dir() else []
        if any(p.stat().st_mtime >= since for p in found):
            return None
    line = report_rebuild_line(trainer, prog)
    return line and line.replace("the end-of-run report may be missing or partial",
                                 "the end-of-run report of this run is missing (it stopped while writing it)")


def _finished(path: Path, trainer) -> Optional[str]:
    """Why the run of the checkpoint at ``path`` has nothing left to train under the trainer's
    limits (:func:`~lightning_pfd.launch.run_checks.finished_run`), or None."""
    from .run_checks import finished_run

    try:
        import torch

        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an unreadable file is reported by the resume itself
        return None
    return finished_run(ckpt, getattr(trainer, "max_epochs", None), getattr(trainer, "max_steps", None))


def _checkpoint_epoch(path: Path) -> Optional[int]:
    try:
        import torch

        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["epoch"])
    except Exception:  # an unreadable file is reported by the resume itself
        return None


#: what a collective raises when another process of the run is gone (gloo's TCP pair, NCCL's
#: watchdog, a closed store socket): this rank lost its peers, it is not a bug of this rank
LOST_PEER_MARKS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                   "remote worker crashing", "NCCL communicator was aborted", "ProcessGroupNCCL",
                   "Socket Timeout", "DistNetworkError")


def lost_peer(error: BaseException, trainer) -> bool:
    """Whether ``error`` is a collective failing because another process of a multi-process run
    stopped (:data:`LOST_PEER_MARKS`), in a run of more than one process."""
    if int(getattr(trainer, "world_size", 1) or 1) < 2:
        return False
    text = f"{type(error).__name__}: {error}"
    return any(m in text for m in LOST_PEER_MARKS)


def lost_peer_status(error: BaseException, trainer, argv: Sequence[str], prog: str) -> int:
    """One block on stderr for a rank whose peers stopped (:func:`lost_peer`): which rank, the
    collective's own first line, what is resumable; exit status 1 (no traceback)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    first = first.split("] ", 1)[-1] if first.startswith("[") else first  # drop gloo's source path
    lines = [f"[lightning_pfd] rank {trainer.global_rank} of {trainer.world_size} stopped: another process "
             f"of this DDP run is gone (killed or crashed; its own output says why), so a collective "
             f"failed: {first[:200]}; exit status 1."]
    ckpt = _last_checkpoint(trainer)
    if bool(argv) and argv[0] == "fit":
        if ckpt is None:
            lines.append("  nothing to resume: no checkpoint was written yet; run the same command again")
        elif _finished(ckpt, trainer) is not None:
            lines.append(f"  training had finished: {ckpt} is the final checkpoint")
        else:
            lines.append(f"  resumable: {ckpt}; resume with: {_resume_command(argv, prog)}")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return 1


def interrupt_status(record: SignalRecord, trainer, argv: Sequence[str], prog: str) -> int:
    """Print :func:`resume_message` on stderr and return the exit status (143 / 130)."""
    print(resume_message(record, trainer, argv, prog), file=sys.stderr, flush=True)
    return record.exit_status
