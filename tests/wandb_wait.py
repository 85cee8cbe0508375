"""The W&B service may still be writing an offline run's log after ``wandb.finish()`` returns
(seen on a loaded machine and with two test workers): tests that read the log back wait for its
exit record first."""
from __future__ import annotations

import time
from pathlib import Path

from lightning_pfd.analysis.history import read_wandb_records


def wait_for_exit_record(run_dir, timeout: float = 60.0):
    """The ``run-*.wandb`` log of ``run_dir``, once it holds its exit record or after ``timeout``
    seconds (then the test reading it fails on what it finds); None when there is no log."""
    deadline = time.monotonic() + timeout
    files = []
    while time.monotonic() < deadline:
        files = list(Path(run_dir).glob("run-*.wandb"))
        if files and any(k == "exit" for k, _ in read_wandb_records(files[0], use_leet=False)[0]):
            break
        time.sleep(0.1)
    return files[0] if files else None
