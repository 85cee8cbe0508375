"""One trial of a sweep: a full ``fit`` in this process, in its own run directory.

:func:`execute_trial` is what the Ray Tune trainable runs (and what a test can call without
Ray). It

1. sets the trial's environment: working directory of the sweep's driver (relative paths of
   the config keep their meaning), W&B settings forwarded from the driver, ``torch`` intra-op
   threads = CPUs per trial (two 2-thread trials on 2 cores run many times slower), and hides
   SLURM variables from Lightning (a trial is one single-process fit, not a SLURM task);
2. skips a trial that already finished (``trial_result.json`` with status ok / diverged): a
   resumed sweep never trains it again, even when Ray's own state was saved before the driver
   was killed; a recorded failure is raised again without training (``--retry-failed`` moves
   the record aside first);
3. resumes from the trial's newest checkpoint (``last.ckpt`` when it is the newest) if there is
   one, else starts a fresh fit in the trial directory;
4. after the fit writes ``endpoints.pt`` (Def. 3's inputs, :mod:`.endpoints`) and
   ``trial_result.json`` (status, error, |θ|, N, epochs, wall time) atomically.

Everything the trial prints goes to ``<trial>/trial.log``. A failing fit is recorded
(``status: failed`` with ``Type: message`` and the traceback in ``trial.log``) and re-raised as
:class:`TrialFailed`, which Ray Tune records as the trial's error.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

__all__ = ["execute_trial", "TrialFailed", "resume_checkpoint", "read_trial_result",
           "RESULT_FILE", "FORWARDED_ENV"]

RESULT_FILE = "trial_result.json"
ATTEMPTS_FILE = "attempts.jsonl"
#: driver environment variables a trial sees (never credentials: they would be stored in Ray's
#: experiment state on disk)
FORWARDED_ENV = ("WANDB_MODE", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                 "WANDB_SILENT", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL",
                 "LIGHTNING_PFD_CACHE", "LIGHTNING_PFD_DEBUG")
FINISHED = ("ok", "diverged")


class TrialFailed(RuntimeError):
    """A trial's fit raised; the message is ``Type: message`` of the original error."""


def _write_json(path: Path, obj) -> None:
    from ..atomic import atomic_write

    atomic_write(path, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")


def read_trial_result(trial_dir) -> Optional[dict]:
    p = Path(trial_dir) / RESULT_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def resume_checkpoint(trial_dir) -> Optional[str]:
    """The trial's newest checkpoint (``last*.ckpt`` among equals), or None (never the weights of
    a cut epoch in ``stopped/``, which are not a resume point)."""
    found = [p for p in Path(trial_dir).rglob("*.ckpt") if p.is_file() and ".tmp" not in p.name
             and p.parent.name != "stopped" and not p.parent.name.startswith("overwritten-")]
    if not found:
        return None
    return str(max(found, key=lambda p: (p.stat().st_mtime, p.name.startswith("last"))))


@contextlib.contextmanager
def _environment(payload: dict):
    """cwd, forwarded env, no SLURM detection, intra-op threads; restored afterwards."""
    import torch

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_threads = torch.get_num_threads()
    try:
        os.chdir(payload["cwd"])
        os.environ.update({k: str(v) for k, v in (payload.get("env") or {}).items()})
        for k in [k for k in os.environ if k.startswith("SLURM_")]:
            del os.environ[k]
        from ..launch.cli import ensure_wandb_mode

        ensure_wandb_mode()
        torch.set_num_threads(max(1, int(payload.get("cpus") or 1)))
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)


@contextlib.contextmanager
def _output_to(path: Path):
    """stdout and stderr of this process (file descriptors 1 and 2) appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(path, "ab") as log:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])


def _finish_wandb(exit_code: int = 0) -> None:
    if "wandb" not in sys.modules:
        return
    import wandb

    if wandb.run is not None:
        wandb.finish(exit_code=exit_code)


def _run_fit(config: dict, ckpt: Optional[str]):
    """``python -m lightning_pfd fit`` in this process on a config dict; returns the CLI."""
    from ..launch import PROG
    from ..launch.cli import PFDLightningCLI

    fit = dict(config)
    if ckpt is not None:
        fit["ckpt_path"] = ckpt
    saved = sys.argv
    sys.argv = [PROG]  # LightningCLI warns when both sys.argv and args are given
    try:
        return PFDLightningCLI(args={"fit": fit}, overwrite=ckpt is None)
    except SystemExit as e:  # a parser error exits; never let it end a Ray worker
        raise RuntimeError(f"the fit command exited with status {e.code} (see trial.log)") from None
    finally:
        sys.argv = saved
        from ..locks import release_all

        release_all()  # the trial's run-directory lock (a reused Ray worker runs the next trial)


def _final_metrics(trainer) -> dict:
    out = {}
    for k, v in trainer.callback_metrics.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def _previous_wall_time(trial_dir: Path) -> float:
    total = 0.0
    try:
        for line in (trial_dir / ATTEMPTS_FILE).read_text().splitlines():
            rec = json.loads(line)
            total += float(rec.get("wall_time_s") or 0.0)
    except (OSError, ValueError):
        pass
    return total


def _log_attempt(trial_dir: Path, record: dict) -> None:
    with open(trial_dir / ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")


def execute_trial(payload: dict) -> dict:
    """Run (or skip, or resume) one trial; returns its ``trial_result.json`` content. Raises
    :class:`TrialFailed` when the fit fails (after recording the failure)."""
    trial_dir = Path(payload["sweep_dir"]) / payload["trial_id"]
    trial_dir.mkdir(parents=True, exist_ok=True)
    prev = read_trial_result(trial_dir)
    if prev is not None and prev.get("status") in FINISHED:
        return prev
    if prev is not None and prev.get("status") == "failed":
        raise TrialFailed(str(prev.get("error")))
    import yaml

    from ..atomic import atomic_write

    atomic_write(trial_dir / "trial_config.yaml", yaml.safe_dump({**payload["config"]}, sort_keys=False))
    base = {k: payload.get(k) for k in ("trial_id", "overrides", "seed", "n_train", "n_params",
                                         "model_label")}
    with _environment(payload):
        ckpt = resume_checkpoint(trial_dir)
        earlier = _previous_wall_time(trial_dir)
        t0 = time.time()
        _log_attempt(trial_dir, {"event": "start", "time": t0, "resume_from": ckpt})
        cli = None
        try:
            with _output_to(trial_dir / "trial.log"):
                print(f"[lightning_pfd sweep] trial {payload['trial_id']}: "
                      + (f"resuming from {ckpt}" if ckpt else "fresh fit"), flush=True)
                try:
                    cli = _run_fit(payload["config"], ckpt)
                    result = _summarize(cli, payload, trial_dir, base)
                except BaseException:
                    traceback.print_exc()
                    _finish_wandb(1)
                    raise
                _finish_wandb(0)
        except BaseException as e:  # noqa: BLE001 - recorded, then raised for Ray
            wall = time.time() - t0
            _log_attempt(trial_dir, {"event": "failed", "time": time.time(), "wall_time_s": wall})
            error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:2000]
            _write_json(trial_dir / RESULT_FILE, {**base, "status": "failed", "error": error,
                                                  "wall_time_s": earlier + wall, "resumed_from": ckpt})
            raise TrialFailed(error) from None
        wall = time.time() - t0
        _log_attempt(trial_dir, {"event": "end", "time": time.time(), "wall_time_s": wall})
        result.update(wall_time_s=earlier + wall, resumed_from=ckpt)
        _write_json(trial_dir / RESULT_FILE, result)
        return result


def _summarize(cli, payload: dict, trial_dir: Path, base: dict) -> dict:
    """Status, |θ|, N, epochs and the endpoints of a finished fit."""
    from ..nets import count_parameters
    from .endpoints import final_endpoints, save_endpoints

    model, trainer, dm = cli.model, cli.trainer, cli.datamodule
    metrics = _final_metrics(trainer)
    nonfinite = metrics.get("pfd/nonfinite", 0.0)
    diverged = bool(getattr(model, "diverged", False)) or (nonfinite == nonfinite and nonfinite > 0)
    net = getattr(model, "net", None)
    n_params = count_parameters(net, trainable_only=True) if net is not None else base.get("n_params")
    n_train = getattr(dm, "n_samples", None) if dm is not None else None
    endpoints_file = None
    opts = payload.get("endpoints") or {}
    if opts.get("enabled", True) and not diverged:
        ends = final_endpoints(trainer, model, dm, max_seeds=opts.get("max_seeds"))
        if ends is not None:
            save_endpoints(trial_dir / "endpoints.pt", ends)
            endpoints_file = "endpoints.pt"
    return {**base, "status": "diverged" if diverged else "ok", "error": None,
            "n_params": int(n_params) if n_params is not None else None,
            "n_train": int(n_train) if n_train else base.get("n_train"),
            "epochs": int(trainer.current_epoch), "global_step": int(trainer.global_step),
            "endpoints": endpoints_file,
            "final_metrics": {k: v for k, v in metrics.items() if "/" in k}}

