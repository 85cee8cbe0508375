"""Shared test setup: one intra-op thread (2-core machine, parallel workers), offline W&B."""

import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# the developers' tools of experiments/ (the null-family generator ``calibration``) are not part
# of the package: the tests import them from there
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))


@pytest.fixture(autouse=True)
def _offline_wandb(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        d = tmp_path / var.lower()
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # an in-process W&B run of an earlier test exports WANDB_SERVICE (its wandb-core service) so
    # that child processes share it; a test's subprocesses must start their own service, or a
    # resumed run finds its id still "in use" in the parent's service
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    monkeypatch.setenv("LIGHTNING_PFD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LIGHTNING_PFD_THREADS", "1")  # CLI runs (in-process or not): 1 thread
    yield


@pytest.fixture(autouse=True)
def _isolated_process_state():
    """Each test starts with one thread: the CLI sets torch's threads."""
    yield
    torch.set_num_threads(1)
