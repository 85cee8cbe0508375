"""Run a sweep's trials on Ray Tune (local embedded Ray, or a running cluster).

Order of :func:`run_sweep`: read + validate every trial (nothing written, Ray not started) →
take the sweep's lock (one driver per sweep name: :mod:`lightning_pfd.locks`) → check the
sweep directory (a new sweep must not overwrite an earlier one; ``--resume`` needs
the same trials) → write ``sweep.json`` → start (or join) Ray → one Tune trial per sweep trial
(``tune.grid_search`` over the trials, ``tune.with_resources`` = CPUs / GPUs per trial, at most
``max_concurrent`` at once, ``FailureConfig(max_failures=0)``: a failing trial is recorded and
the others go on) → ``sweep_results.csv`` / ``.json`` from the trials' own histories.

Resume: the trials without a result on disk (``trial_result.json``: never run, interrupted, or
whose files were deleted after they finished) run again, in a new Tune experiment
``runs/<sweep>/ray-resume-<k>`` (Ray Tune's own ``Tuner.restore`` would never re-run a trial it
recorded as finished); failed trials keep their failure record and run again only with
``--retry-failed``. The trials themselves are idempotent (see :mod:`.trial`): a trial whose
result is on disk is never trained again, and an interrupted one resumes from its checkpoint.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Callable, Optional

from ..errors import ConfigError
from ..locks import acquire as acquire_lock
from .aggregate import aggregate_sweep
from .ray_watchdog import start_watchdog, stop_watchdog
from .spec import Resources, SweepSpec, check_resources
from .validate import validate_trials
from .trial import FORWARDED_ENV, RESULT_FILE, execute_trial, read_trial_result

__all__ = ["run_sweep", "run_trial", "plan", "format_plan", "unfinished", "RAY_DIR"]

RAY_DIR = "ray"  # Ray Tune's experiment directory inside the sweep directory


# ----------------------------------------------------------------------------- Ray trainable
def run_trial(config: dict, payloads: dict) -> None:
    """The Ray Tune function trainable: one trial, then one report of its final metrics.
    ``config["trial"]`` (its short name; ``config["trial_id"]`` in sweeps started before short
    names) picks the trial; ``payloads`` (name or id → trial description, passed with
    ``tune.with_parameters``) keeps the configs out of Tune's parameter table."""
    from ray import tune

    result = execute_trial(payloads[_config_key(config)])
    final = result.get("final_metrics") or {}
    metrics = {k.replace("/", "_"): float(final[k]) for k in _TUNE_METRICS if k in final}
    tune.report({"status_ok": float(result.get("status") == "ok"),
                 "wall_time_s": float(result.get("wall_time_s") or 0.0), **metrics})


#: the final metrics a trial reports to Tune (its table); the full record is sweep_results.csv
_TUNE_METRICS = ("pfd/e_gen", "pfd/e_mem", "loss/train_fixed", "loss/test_fixed")


def short_names(trial_ids) -> dict:
    """trial id -> its short name in Ray Tune's progress table: ``t01``, ``t02``, ... in plan
    order (Tune cuts table cells to 20 characters, which made long ids look identical)."""
    ids = list(trial_ids)
    width = max(2, len(str(len(ids))))
    return {tid: f"t{i:0{width}d}" for i, tid in enumerate(ids, start=1)}


def _config_key(config: dict) -> str:
    return str(config["trial"] if "trial" in config else config["trial_id"])


def _trial_name(trial) -> str:
    """Tune's trial name (and trial directory under ``ray/``): the trial's short name."""
    return _config_key(trial.config)


# ----------------------------------------------------------------------------- planning
def plan(spec: SweepSpec, construct: bool = True, write_cache: bool = True) -> list:
    """Validated trials of ``spec`` (ConfigError on the first problem; nothing written but the
    data's cache entries, and those only with ``write_cache``)."""
    return validate_trials(spec, construct=construct, write_cache=write_cache)


def format_plan(spec: SweepSpec, trials: list, resources: Resources) -> str:
    lines = [f"sweep {spec.name}: {len(trials)} trials -> {spec.sweep_dir}",
             f"  base config: {spec.base}",
             f"  resources per trial: {resources.cpus_per_trial:g} CPU, {resources.gpus_per_trial:g} GPU"
             + (f"; at most {resources.max_concurrent} at once" if resources.max_concurrent else ""),
             "", f"  {'name':<5} {'trial':<48} {'N':>7} {'|theta|':>11}  model"]
    names = short_names(t.trial_id for t in trials)
    for t in trials:
        n = "" if t.n_train is None else str(t.n_train)
        p = "" if t.n_params is None else f"{t.n_params:,}"
        lines.append(f"  {names[t.trial_id]:<5} {t.trial_id:<48} {n:>7} {p:>11}  {t.model_label}")
    return "\n".join(lines)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("lightning_pfd", "torch", "lightning", "ray", "jsonargparse", "wandb"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # not installed (ray before the sweep extra)
            out[name] = None
    return out


def _check_devices(trials: list, resources: Resources, address: Optional[str]) -> None:
    """A GPU config needs GPUs per trial; local resources must exist on this machine."""
    for t in trials:
        acc = str(((t.config.get("trainer") or {}).get("accelerator") or "auto")).lower()
        if acc in ("gpu", "cuda") and resources.gpus_per_trial <= 0:
            raise ConfigError("--gpus-per-trial", f"trial {t.trial_id} trains on accelerator "
                              f"{acc!r} but no GPU is given to a trial", value=resources.gpus_per_trial,
                              suggestion="pass --gpus-per-trial 1 (or resources.gpus_per_trial in the sweep file)")
    if address is not None:
        return
    cores = os.cpu_count() or 1
    if resources.cpus_per_trial > cores:
        raise ConfigError("--cpus-per-trial", f"this machine has {cores} cores: no trial could start",
                          value=resources.cpus_per_trial, accepted=f"a number in (0, {cores}]")
    if resources.gpus_per_trial > 0:
        import torch

        if torch.cuda.device_count() == 0:
            raise ConfigError("--gpus-per-trial", "this machine has no GPU: no trial could start",
                              value=resources.gpus_per_trial,
                              suggestion="run on a Ray cluster with GPUs (--address) or use 0")


def _sweep_record(spec: SweepSpec, trials: list, resources: Resources) -> dict:
    return {"name": spec.name, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "spec": spec.to_dict(), "sweep_file": None if spec.source is None else str(spec.source),
            "resources": {"cpus_per_trial": resources.cpus_per_trial,
                          "gpus_per_trial": resources.gpus_per_trial,
                          "max_concurrent": resources.max_concurrent},
            "grid": spec.grid, "seeds": spec.seeds, "versions": _versions(),
            "trials": [t.summary() for t in trials]}


def _check_sweep_dir(spec: SweepSpec, trials: list, resume: bool) -> Optional[dict]:
    """Refuse to overwrite an earlier sweep; on resume, require the same trials."""
    d = spec.sweep_dir
    record = d / "sweep.json"
    if not resume:
        if record.exists():
            raise ConfigError("--name", f"a sweep named {spec.name!r} exists in {d}",
                              value=spec.name, suggestion="continue it with --resume, or choose another --name")
        return None
    if not record.exists():
        raise ConfigError("--resume", f"no sweep to resume in {d} (no sweep.json)",
                          suggestion="start it without --resume")
    try:
        old = json.loads(record.read_text())
    except ValueError as e:
        raise ConfigError("--resume", f"{record} is not readable JSON: {e}") from e
    before = [t["trial_id"] for t in old.get("trials", [])]
    now = [t.trial_id for t in trials]
    if before != now:
        added = sorted(set(now) - set(before))
        gone = sorted(set(before) - set(now))
        raise ConfigError("--resume", "the sweep file no longer gives the trials of the sweep it resumes"
                          + (f"; new: {added[:3]}" if added else "") + (f"; missing: {gone[:3]}" if gone else ""),
                          suggestion="resume with the sweep file it started with, or start a new sweep "
                                     "with another --name")
    sha = {t["trial_id"]: t.get("config_sha256") for t in old.get("trials", [])}
    old_dir = _recorded_sweep_dir(spec, old, trials)  # a record of an earlier release: absolute paths
    changed = [t.trial_id for t in trials
               if sha.get(t.trial_id) not in (None, t.config_sha, t.legacy_config_sha,
                                              t.legacy_config_sha_at(old_dir or t.sweep_dir))]
    if changed:
        raise ConfigError("--resume", f"the configs of {len(changed)} trial(s) changed since the sweep "
                          f"started (base config or shared settings edited?), e.g. {changed[0]}",
                          suggestion="restore the files the sweep started with, or start a new sweep "
                                     "with another --name")
    return old


def _recorded_sweep_dir(spec: SweepSpec, old: dict, trials: list) -> Optional[str]:
    """Where the sweep of the record ``old`` was when it started (its trials' configs hold that
    absolute path): the record's own ``sweep_dir``, an absolute ``root``, or the parent of the
    ``default_root_dir`` a trial's ``config.yaml`` names."""
    if old.get("sweep_dir"):
        return str(old["sweep_dir"])
    root = (old.get("spec") or {}).get("root")
    if root and Path(root).is_absolute():
        return str(Path(root) / spec.name)
    import yaml

    for t in trials:
        cfg = spec.sweep_dir / t.trial_id / "config.yaml"
        try:
            given = ((yaml.safe_load(cfg.read_text()) or {}).get("trainer") or {}).get("default_root_dir")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(given, str) and Path(given).name == t.trial_id:
            return str(Path(given).parent)
    return None


#: the raylet's setting of its workers' niceness (Ray's default: 15)
WORKER_NICENESS_ENV = "RAY_worker_niceness"


def _env() -> dict:
    return {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}


def _payloads(spec: SweepSpec, trials: list, resources: Resources) -> dict:
    """trial id and short name -> the trial's description (the same object under both keys)."""
    env, cwd = _env(), os.getcwd()
    by_id = {t.trial_id: {"trial_id": t.trial_id, "sweep_dir": str(spec.sweep_dir), "sweep_name": spec.name,
             "cwd": cwd, "config": t.config, "cpus": resources.cpus_per_trial, "env": env,
             "endpoints": spec.endpoints, "overrides": t.overrides, "seed": t.seed,
             "n_train": t.n_train, "n_params": t.n_params, "model_label": t.model_label}
             for t in trials}
    names = short_names(by_id)
    return {**by_id, **{names[tid]: p for tid, p in by_id.items()}}


def _retry_failed(spec: SweepSpec, trials: list) -> list:
    """Move the failure records aside so the trials run again; returns their ids."""
    moved = []
    for t in trials:
        d = spec.sweep_dir / t.trial_id
        res = read_trial_result(d)
        if res is not None and res.get("status") == "failed":
            k = 1
            while (d / f"trial_result.failed-{k}.json").exists():
                k += 1
            os.replace(d / RESULT_FILE, d / f"trial_result.failed-{k}.json")
            moved.append(t.trial_id)
    return moved


# ----------------------------------------------------------------------------- Ray
#: seconds to wait for a TCP answer from ``--address HOST:PORT`` before Ray is asked to join
ADDRESS_TIMEOUT_S = 10.0

#: what a driver needs to join a cluster with token authentication (Ray 2.60: on by default)
TOKEN_HINT = ("the head answers but refused this driver, which sends no authentication token "
              "(Ray 2.60's `ray start --head` enables token authentication): run the driver with "
              "RAY_AUTH_MODE=token and the head's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH / "
              "RAY_AUTH_TOKEN), or use --address auto on a node of the cluster")


def ray_token_available() -> Optional[str]:
    """Where a Ray authentication token is available to this driver (None: nowhere)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), os.path.expanduser("~/.ray/auth_token")):
        if path and os.path.isfile(path) and os.path.getsize(path) > 0:
            return path
    return None


def prepare_ray_auth(address: Optional[str], echo: Callable[[str], None] = print) -> None:
    """``--address HOST:PORT`` with a token at hand and RAY_AUTH_MODE unset: set it to ``token``,
    as ``--address auto`` does by itself (a head without authentication ignores the token). Must
    run before Ray is imported (Ray reads RAY_AUTH_MODE once)."""
    if address in (None, "auto", "local") or "RAY_AUTH_MODE" in os.environ:
        return
    where = ray_token_available()
    if where is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        echo(f"[lightning_pfd] RAY_AUTH_MODE=token: joining {address} with the Ray token of {where} "
             "(set RAY_AUTH_MODE=disabled to join without it)")


def check_address(address: Optional[str], timeout: float = ADDRESS_TIMEOUT_S) -> None:
    """``--address``: ``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT``; for a host and
    port, a TCP connection must open within ``timeout`` seconds (Ray itself would retry for
    minutes when nothing listens there)."""
    if address is None or address in ("auto", "local"):
        return
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("--address", "not a Ray address", value=address,
                          accepted="auto, HOST:PORT (the head's GCS port, 6379 by default) or ray://HOST:PORT")
    import socket

    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        why = f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e)).lower()
        raise ConfigError("--address", f"no Ray head answers at {target} ({why})", value=address,
                          suggestion="start the head with `ray start --head --port PORT` on that host, "
                                     "check the host and port (`ray status` on the head), or pass "
                                     "--address auto on a node of the cluster") from None


def _is_auth_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}"
    return "AuthenticationError" in text or "InvalidAuthToken" in text or "auth token" in text.lower()


def _start_ray(address: Optional[str], session: Optional[dict] = None) -> bool:
    """Join or start Ray; returns True when this call started it (and must shut it down). A Ray
    started locally writes its session directory to ``session["dir"]`` (from the context
    ``ray.init`` returns)."""
    import ray

    if ray.is_initialized():
        return False
    check_address(address)
    kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                  configure_logging=True)
    try:
        if address:
            ctx = ray.init(address=address, **kwargs)
            if session is not None and address == "local":  # a new local Ray, like no --address
                session["dir"] = (getattr(ctx, "address_info", None) or {}).get("session_dir")
        else:
            # Ray's raylet starts workers at niceness 15 unless told otherwise: the trials are the
            # sweep's work, and at 15 any other process on the machine takes their cores
            os.environ.setdefault(WORKER_NICENESS_ENV, "0")
            ctx = ray.init(address="local", num_cpus=os.cpu_count() or 1, **kwargs)  # never an older cluster
            if session is not None:
                session["dir"] = (getattr(ctx, "address_info", None) or {}).get("session_dir")
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RayError, RuntimeError, ...
        if ray.is_initialized():
            ray.shutdown()
        refused = _is_auth_error(e) or "Failed to connect to Ray cluster" in str(e)  # the port answered
        if address not in (None, "auto", "local") and refused and os.environ.get("RAY_AUTH_MODE") != "token":
            raise ConfigError("--address", f"cannot join the Ray cluster at {address}: {TOKEN_HINT}",
                              value=address) from None
        if not isinstance(e, (ConnectionError, ValueError, RuntimeError)) and not _is_auth_error(e):
            raise
        raise ConfigError("--address" if address else "ray", f"cannot start / join Ray: "
                          f"{' '.join(str(e).split())[:300]}", value=address,
                          suggestion="start the head with `ray start --head` and pass "
                                     "--address auto or HEAD_IP:6379" if address else None) from e
    return True


def _ray_errors(grid, trial_ids) -> dict:
    """trial id -> ``Type: message`` of every errored Tune trial."""
    out = {}
    by_name = {name: tid for tid, name in short_names(trial_ids).items()}
    for i in range(len(grid)):
        r = grid[i]
        if r.error is None:
            continue
        config = r.config or {}
        tid = by_name.get(config.get("trial"), config.get("trial_id"))
        err = r.error
        cause = getattr(err, "cause", None) or err
        text = str(cause).strip().splitlines()
        msg = text[-1] if text else type(cause).__name__
        out[tid] = msg if ":" in msg else f"{type(cause).__name__}: {msg}"
    return out


def _tuner(spec: SweepSpec, trials: list, resources: Resources, todo: Optional[list] = None):
    """A Tune experiment over the trials of ``todo`` (default: all), named by their short names
    in plan order. The first run of a sweep writes it to ``ray/``; a resumption to a new
    ``ray-resume-<k>/`` over the trials without a result on disk (see :func:`_run_locked`)."""
    from ray import tune

    trainable = tune.with_resources(
        tune.with_parameters(run_trial, payloads=_payloads(spec, trials, resources)),
        {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial})
    names = short_names(t.trial_id for t in trials)
    run = [names[t.trial_id] for t in (trials if todo is None else todo)]
    name = RAY_DIR
    if todo is not None:
        k = 1
        while (spec.sweep_dir / f"{RAY_DIR}-resume-{k}").exists():
            k += 1
        name = f"{RAY_DIR}-resume-{k}"
    return tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search(run)},
        tune_config=tune.TuneConfig(max_concurrent_trials=resources.max_concurrent, reuse_actors=True,
                                    trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name=name, storage_path=str(spec.sweep_dir), verbose=1,
                                  failure_config=tune.FailureConfig(max_failures=0, fail_fast=False)))


def unfinished(spec: SweepSpec, trials: list) -> list:
    """The trials with no ``trial_result.json`` on disk: never run, interrupted, or whose files
    were deleted after they finished (a resumption runs exactly these; a failed trial has its
    failure recorded and is run again only with ``--retry-failed``)."""
    return [t for t in trials if read_trial_result(spec.sweep_dir / t.trial_id) is None]


def _summary(rows: list, sweep_dir: Path) -> str:
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = ["[lightning_pfd] sweep finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
             f"  results: {sweep_dir / 'sweep_results.csv'} (and .json)"]
    for r in rows:
        if r["status"] == "failed":
            lines.append(f"  failed: {r['trial_id']}: {r['error']}")
    for r in rows:
        if r["status"] == "missing":
            lines.append(f"  missing: {r['trial_id']}: {r['error']}")
    if counts.get("pending") or counts.get("missing"):
        lines.append("  continue the pending / missing trials with --resume")
    return "\n".join(lines)


def run_sweep(spec: SweepSpec, resources: Optional[Resources] = None, resume: bool = False,
              retry_failed: bool = False, address: Optional[str] = None, dry_run: bool = False,
              echo: Optional[Callable[[str], None]] = None) -> int:
    """Validate, run and aggregate a sweep (see the module docstring). Returns 0 when every trial
    finished (ok or diverged), 1 when some failed or are pending, after writing the results.
    ``echo`` prints a line (default: ``print``, flushed: a process forked later must not inherit
    and print the lines again)."""
    echo = echo or functools.partial(print, flush=True)
    resources = check_resources(resources or spec.resources)
    if retry_failed and not resume:
        raise ConfigError("--retry-failed", "only with --resume (it re-runs the failed trials of an "
                                            "existing sweep)")
    if not dry_run:
        check_address(address)  # seconds, not the minutes of Ray's own retries
    trials = plan(spec, write_cache=not dry_run)  # a dry run: the same pre-flight, nothing written
    if dry_run:
        echo(format_plan(spec, trials, resources))
        echo("\n(dry run: every trial parsed, built and checked as `fit` checks it before training, "
             "its |theta| counted; nothing was run or written)")
        return 0
    _ensure_importable()
    _check_devices(trials, resources, address)
    # one driver per sweep name: a second one fails here, naming the first (locks.py)
    lock = acquire_lock(spec.sweep_dir, "sweep", "--name", command=f"sweep {spec.name}")
    try:
        rows = _run_locked(spec, trials, resources, resume, retry_failed, address, echo)
    finally:
        if lock is not None:  # a sweep that wrote nothing leaves no directory either
            lock.release(remove_created_dir=not (spec.sweep_dir / "sweep.json").exists())
    echo(_summary(rows, spec.sweep_dir))
    return 0 if all(r["status"] in ("ok", "diverged") for r in rows) else 1


def _run_locked(spec: SweepSpec, trials: list, resources: Resources, resume: bool, retry_failed: bool,
                address: Optional[str], echo: Callable[[str], None]) -> list:
    """The part of :func:`run_sweep` under the sweep's lock; returns the aggregated rows."""
    old = _check_sweep_dir(spec, trials, resume)
    session: dict = {}
    started = _start_ray(address, session)  # a cluster that cannot be joined fails before anything is written
    # a Ray this driver started goes with it, even when the driver is SIGKILLed (ray_watchdog.py)
    watchdog = start_watchdog(session["dir"]) if session.get("dir") else None
    try:
        _write_record(spec, trials, resources, old, retry_failed)
        if retry_failed:
            moved = _retry_failed(spec, trials)
            echo(f"[lightning_pfd] retrying {len(moved)} failed trial(s)")
        todo = unfinished(spec, trials) if resume else None
        if resume:
            echo(f"[lightning_pfd] resuming sweep {spec.name} in {spec.sweep_dir}: {len(todo)} of "
                 f"{len(trials)} trials to run (no result on disk: not run yet, interrupted, or their "
                 "files deleted)")
        else:
            echo(format_plan(spec, trials, resources))
        errors = {}
        if todo is None or todo:
            tuner = _tuner(spec, trials, resources, todo)
            errors = _ray_errors(tuner.fit(), [t.trial_id for t in trials])
    finally:
        if started:
            import ray

            ray.shutdown()
        stop_watchdog(watchdog)
    return aggregate_sweep(spec.sweep_dir, ray_errors=errors)


def _write_record(spec: SweepSpec, trials: list, resources: Resources, old: Optional[dict],
                  retry_failed: bool) -> None:
    """``sweep.json`` (atomic): the record of a new sweep, or the old one plus this resumption."""
    from ..atomic import atomic_write

    spec.sweep_dir.mkdir(parents=True, exist_ok=True)
    record = old or _sweep_record(spec, trials, resources)
    if old is not None:
        record.setdefault("resumed", []).append({"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                 "retry_failed": retry_failed, "versions": _versions()})
        record["trials"] = [t.summary() for t in trials]  # the same trials (checked): today's fingerprints
    record["sweep_dir"] = str(spec.sweep_dir)
    atomic_write(spec.sweep_dir / "sweep.json", json.dumps(record, indent=1, default=str) + "\n")


def _ensure_importable() -> None:  # pragma: no cover - a clear message instead of ImportError
    try:
        import ray.tune  # noqa: F401
    except ImportError as e:
        raise ConfigError("sweep", "needs Ray Tune, which is not installed",
                          suggestion='pip install "lightning_pfd[sweep]"  (or ray[tune])') from e
