"""Sweep files: read and expand into trials (validated by :mod:`.validate` before anything runs).

A sweep file (YAML) holds the base ``fit`` config, a grid of dotted overrides, repeats (training
seeds, for the bias–variance decomposition of Def. 3 of the PFD paper) and settings shared by
every trial::

    name: mtog_digits                 # default: the file's stem; --name overrides it
    base: quickstart                  # a fit config: a path or the name of an embedded config
    root: runs                        # the sweep directory is <root>/<name>
    shared:                           # dotted overrides applied to every trial
      trainer.max_epochs: 40
      trainer.callbacks[ICRMonitor]: null                      # null removes a list entry
      trainer.callbacks[GeneralizationMonitor].init_args.num_eval: 128
    grid:                             # the Cartesian product of these values
      data.init_args.n_train: [32, 64, 128]
      model.init_args.net.init_args.hidden: [64, 128]
    repeats: 2                        # training seeds 0, 1 (or seeds: [3, 7])
    resources: {cpus_per_trial: 1, gpus_per_trial: 0, max_concurrent: null}
    endpoints: {enabled: true, max_seeds: null}

Dotted keys follow the config's nesting; ``[Name]`` selects the entry of a list (callbacks,
loggers) whose class is ``Name`` (or ``[2]`` by position). A trial's seed is written to every
key of ``seed_keys`` (default: ``seed_everything``, plus ``data.init_args.seed`` and a non-null
``model.init_args.train_seed`` when the base config has them): network initialisation, training
noise and minibatch order change between repeats, the N training samples do not. Def. 3 of the
PFD paper trains the K students on *independent* training sets of the same size: give
``seed_keys`` as a mapping key → factor, e.g. ``{seed_everything: 1, data.init_args.seed: 1,
data.init_args.train_seed_offset: 8192}`` (repeat k draws its N samples from the teacher seeds
[8192 k, 8192 k + N), disjoint from the test and evaluation seeds; checked by the datamodule).

:func:`lightning_pfd.sweeps.validate.validate_trials` checks every trial's full config against the ``fit`` parser (nothing
runs, nothing is written): an unknown key (with a "did you mean"), a wrong type or a value a class
refuses fails the whole sweep with a :class:`~lightning_pfd.errors.ConfigError` naming the trial
and the key. It also counts each student's trainable parameters |θ| (the net is built on the
``meta`` device: no memory, no time).
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from ..launch.run_safety import check_unique_keys
from ..errors import ConfigError, did_you_mean

__all__ = ["SweepSpec", "Trial", "Resources", "load_sweep", "expand_trials",
           "apply_override", "split_key", "trial_id_for", "relocate_outputs", "SWEEP_KEYS"]

SWEEP_KEYS = ("name", "description", "base", "root", "shared", "grid", "repeats", "seeds",
              "seed_keys", "resources", "endpoints")
RESOURCE_KEYS = ("cpus_per_trial", "gpus_per_trial", "max_concurrent")
ENDPOINT_KEYS = ("enabled", "max_seeds")
#: init_args that name an output location: moved under the trial's directory
OUTPUT_PATH_KEYS = ("dirpath", "report_dir", "save_dir", "out_dir", "output_dir", "log_dir")
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_ID = 96


# ----------------------------------------------------------------------------- data classes
@dataclass
class Resources:
    """Ray resources of one trial and the concurrency cap (None: as many as fit)."""

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent: Optional[int] = None


@dataclass
class SweepSpec:
    """A parsed sweep file (see the module docstring)."""

    name: str
    base: Path
    root: Path
    shared: dict
    grid: dict
    seeds: list
    seed_keys: Optional[dict]
    resources: Resources
    endpoints: dict
    source: Optional[Path] = None
    description: str = ""
    raw: dict = field(default_factory=dict)

    @property
    def sweep_dir(self) -> Path:
        return (self.root / self.name).resolve()

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "base": str(self.base),
                "root": str(self.root), "source": None if self.source is None else str(self.source),
                "shared": self.shared, "grid": self.grid, "seeds": self.seeds,
                "seed_keys": self.seed_keys, "resources": asdict(self.resources),
                "endpoints": self.endpoints}


@dataclass
class Trial:
    """One point of the grid × one seed: its id, overrides and full ``fit`` config."""

    trial_id: str
    index: int
    overrides: dict
    seed: Optional[int]
    config: dict
    n_train: Optional[int] = None
    n_params: Optional[int] = None
    model_label: str = ""
    sweep_dir: Optional[str] = None

    @property
    def config_sha(self) -> str:
        """sha256 of the trial's full fit config (a resumed sweep must run the same configs), with
        the sweep directory written as ``<sweep_dir>``: a sweep folder moved or copied elsewhere
        keeps its fingerprints."""
        text = json.dumps(self.config, sort_keys=True, default=str)
        if self.sweep_dir:
            text = text.replace(json.dumps(str(self.sweep_dir))[1:-1], "<sweep_dir>")
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def legacy_config_sha(self) -> str:
        """The fingerprint of sweeps recorded before ``<sweep_dir>`` was written relative (with
        the absolute paths of the sweep directory)."""
        return self.legacy_config_sha_at(self.sweep_dir)

    def legacy_config_sha_at(self, old_sweep_dir) -> str:
        """:attr:`legacy_config_sha` of this trial had its sweep directory been ``old_sweep_dir``."""
        text = json.dumps(self.config, sort_keys=True, default=str)
        if self.sweep_dir and old_sweep_dir:
            text = text.replace(json.dumps(str(self.sweep_dir))[1:-1], json.dumps(str(old_sweep_dir))[1:-1])
        return hashlib.sha256(text.encode()).hexdigest()

    def summary(self) -> dict:
        return {"trial_id": self.trial_id, "index": self.index, "overrides": self.overrides,
                "seed": self.seed, "n_train": self.n_train, "n_params": self.n_params,
                "model_label": self.model_label, "config_sha256": self.config_sha}


# ----------------------------------------------------------------------------- dotted keys
@dataclass(frozen=True)
class Selector:
    """``[Name]`` (class name or class_path) or ``[i]`` (position) in a dotted key."""

    text: str


_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[([^\[\]]+)\]")


def split_key(key: str, field_name: str = "key") -> list:
    """``trainer.callbacks[ICRMonitor].init_args.level`` → ``['trainer', 'callbacks',
    Selector('ICRMonitor'), 'init_args', 'level']``."""
    if not isinstance(key, str) or not key or key.startswith(".") or key.endswith("."):
        raise ConfigError(field_name, "a dotted config key is expected", value=key,
                          accepted="e.g. data.init_args.n_train or trainer.callbacks[Name].init_args.x")
    tokens, pos = [], 0
    for m in _TOKEN.finditer(key):
        if m.start() != pos:
            break
        tokens.append(m.group(1) if m.group(1) is not None else Selector(m.group(2).strip()))
        pos = m.end()
    if pos != len(key) or not tokens or isinstance(tokens[0], Selector):
        raise ConfigError(field_name, "not a dotted config key", value=key,
                          accepted="e.g. data.init_args.n_train or trainer.callbacks[Name].init_args.x")
    return tokens


def _class_name(entry: Any) -> Optional[str]:
    if isinstance(entry, dict) and isinstance(entry.get("class_path"), str):
        return entry["class_path"]
    if isinstance(entry, str):
        return entry
    return None


def _select(items: list, sel: Selector, key: str) -> int:
    """Index of the entry ``sel`` names in a list of class configs."""
    if re.fullmatch(r"-?\d+", sel.text):
        i = int(sel.text)
        if -len(items) <= i < len(items):
            return i % len(items)
        raise ConfigError(key, f"position [{i}] is out of range: the list has {len(items)} entries",
                          value=sel.text)
    names = [_class_name(e) or "?" for e in items]
    hits = [i for i, n in enumerate(names) if n == sel.text or n.rsplit(".", 1)[-1] == sel.text]
    if len(hits) == 1:
        return hits[0]
    short = [n.rsplit(".", 1)[-1] for n in names]
    if not hits:
        raise ConfigError(key, f"no entry of class {sel.text!r} in this list", value=sel.text,
                          accepted=short)
    raise ConfigError(key, f"{len(hits)} entries of class {sel.text!r}: select one by position",
                      value=sel.text, accepted=[f"[{i}]" for i in hits])


def _format(tokens: list) -> str:
    out = ""
    for t in tokens:
        out += f"[{t.text}]" if isinstance(t, Selector) else (("." if out else "") + t)
    return out


def apply_override(cfg: dict, key: str, value: Any) -> None:
    """Set ``key`` (dotted, with ``[Name]`` selectors) to ``value`` in a raw config dict, in
    place. Missing mappings on the way are created; a selected list entry set to None is
    removed; a single class config where a list is selected is treated as a list of one."""
    tokens = split_key(key)
    parent, last = None, None
    node: Any = cfg
    for i, tok in enumerate(tokens):
        final = i == len(tokens) - 1
        if isinstance(tok, Selector):
            if isinstance(node, dict) and "class_path" in node:  # one logger / callback
                node = [node]
                _set(parent, last, node)
            if not isinstance(node, list):
                raise ConfigError(key, f"{_format(tokens[:i])} is not a list: [{tok.text}] selects "
                                       "an entry of a list", value=key)
            idx = _select(node, tok, key)
            if final:
                if value is None:
                    del node[idx]
                else:
                    node[idx] = copy.deepcopy(value)
                return
            parent, last, node = node, idx, node[idx]
            continue
        if node is None:  # e.g. init_args: null in the YAML
            node = {}
            _set(parent, last, node)
        if not isinstance(node, dict):
            raise ConfigError(key, f"{_format(tokens[:i]) or 'the config'} is a value, not a "
                                   f"mapping: it has no key {tok!r}", value=key)
        if final:
            node[tok] = copy.deepcopy(value)
            return
        if node.get(tok) is None:
            node[tok] = {}
        parent, last, node = node, tok, node[tok]


def _set(parent, key, value) -> None:
    if parent is not None:
        parent[key] = value


def check_known_key(parsed: dict, key: str, skip_prefixes: tuple = ()) -> None:
    """Raise ConfigError (with a "did you mean") unless ``key`` exists in ``parsed``, a fully
    parsed config (every class argument present with its default)."""
    if any(key == p or key.startswith(p + ".") or key.startswith(p + "[") for p in skip_prefixes):
        return
    tokens = split_key(key)
    node: Any = parsed
    for i, tok in enumerate(tokens):
        where = _format(tokens[:i]) or "the fit config"
        if isinstance(tok, Selector):
            if isinstance(node, dict) and "class_path" in node:
                node = [node]
            if not isinstance(node, list):
                raise ConfigError(key, f"{where} is not a list: [{tok.text}] selects a list entry",
                                  value=key)
            node = node[_select(node, tok, key)]
            continue
        if not isinstance(node, dict):
            raise ConfigError(key, f"unknown key: {where} is a value, it has no {tok!r}", value=tok)
        if tok not in node:
            options = sorted(k for k in node if k != "__path__")
            close = did_you_mean(tok, options)
            hint = f"did you mean {_format(tokens[:i] + [close])}?" if close else None
            raise ConfigError(key, f"unknown key: {where} has no {tok!r}", value=tok,
                              accepted=options if len(options) <= 40 else f"{len(options)} keys",
                              suggestion=hint)
        node = node[tok]


# ----------------------------------------------------------------------------- reading
def _resolve_base(value: Any, source: Optional[Path]) -> Path:
    from ..launch import CONFIG_DIR

    if not isinstance(value, str) or not value:
        raise ConfigError("base", "the base fit config is required: a path or an embedded name",
                          value=value, accepted=sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    cands = [Path(value)]
    if source is not None and not Path(value).is_absolute():
        cands.append(source.parent / value)
    cands += [CONFIG_DIR / value, CONFIG_DIR / f"{value}.yaml"]
    for c in cands:
        if c.is_file():
            return c.resolve()
    embedded = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError("base", "no such file, and not the name of an embedded config", value=value,
                      accepted=embedded)


def _int_list(name: str, value: Any) -> list:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ConfigError(name, "must be a non-empty list of integers >= 0", value=value)
    if len(set(value)) != len(value):
        raise ConfigError(name, "must not repeat a seed", value=value)
    return list(value)


def _seed_keys(value: Any) -> Optional[dict]:
    """``seed_keys``: a list of dotted keys (each set to the seed) or a mapping key → integer
    factor (set to seed × factor, e.g. ``data.init_args.train_seed_offset: 8192`` gives each
    repeat its own training set: Def. 3's independent datasets)."""
    if value is None:
        return None
    if isinstance(value, list):
        value = {k: 1 for k in value}
    if not isinstance(value, dict) or not value:
        raise ConfigError("seed_keys", "must be a non-empty list of dotted keys or a mapping key -> "
                          "integer factor", value=value)
    for k, f in value.items():
        split_key(k, f"seed_keys: {k!r}")
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ConfigError(f"seed_keys: {k}", "the factor must be an integer >= 0 (the key is set "
                              "to seed x factor)", value=f)
    return dict(value)


def _overrides(name: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(name, "must be a mapping of dotted keys to values", value=value,
                          accepted="e.g. {trainer.max_epochs: 40}")
    for k in value:
        split_key(k, f"{name}: {k!r}")
    return dict(value)


def _resources(value: Any) -> Resources:
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ConfigError("resources", "must be a mapping", value=value, accepted=list(RESOURCE_KEYS))
    for k in value:
        if k not in RESOURCE_KEYS:
            raise ConfigError(f"resources.{k}", "unknown key", value=k, accepted=list(RESOURCE_KEYS))
    r = Resources(**{k: v for k, v in value.items() if v is not None or k == "max_concurrent"})
    return check_resources(r, "resources.")


def check_resources(r: Resources, prefix: str = "--") -> Resources:
    """Numbers Ray accepts: cpus > 0, 0 <= gpus <= 1 (one process per trial), max_concurrent >= 1."""
    sep = "-" if prefix == "--" else "_"
    for name, v, lo in (("cpus_per_trial", r.cpus_per_trial, 0.0), ("gpus_per_trial", r.gpus_per_trial, 0.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo \
                or (name == "cpus_per_trial" and v <= 0):
            raise ConfigError(prefix + name.replace("_", sep), "must be a number " +
                              ("> 0" if name == "cpus_per_trial" else ">= 0"), value=v)
    if r.gpus_per_trial > 1:
        raise ConfigError(prefix + "gpus_per_trial".replace("_", sep),
                          "a trial is one process (one fit, devices: 1): at most 1 GPU per trial "
                          "(a fraction packs several trials on one GPU)", value=r.gpus_per_trial,
                          accepted="a number in [0, 1]")
    m = r.max_concurrent
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise ConfigError(prefix + "max_concurrent".replace("_", sep), "must be an integer >= 1 or null",
                          value=m)
    return r


def _endpoints(value: Any) -> dict:
    if value is None or value is True:
        value = {}
    if value is False:
        return {"enabled": False, "max_seeds": None}
    if not isinstance(value, dict):
        raise ConfigError("endpoints", "must be a mapping, true or false", value=value,
                          accepted=list(ENDPOINT_KEYS))
    for k in value:
        if k not in ENDPOINT_KEYS:
            raise ConfigError(f"endpoints.{k}", "unknown key", value=k, accepted=list(ENDPOINT_KEYS))
    out = {"enabled": bool(value.get("enabled", True)), "max_seeds": value.get("max_seeds")}
    m = out["max_seeds"]
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise ConfigError("endpoints.max_seeds", "must be an integer >= 1 or null (all the "
                          "GeneralizationMonitor's seeds)", value=m)
    return out


def check_name(name: Any, field_name: str = "name") -> str:
    if not isinstance(name, str) or not _NAME_OK.match(name) or len(name) > 80:
        raise ConfigError(field_name, "a sweep name is letters, digits, '.', '_' and '-' (it names "
                                      "the directory runs/<name>)", value=name)
    return name


def load_sweep(path, name: Optional[str] = None) -> SweepSpec:
    """Read and check a sweep file (a path, or the name of an embedded sweep in
    ``lightning_pfd/configs/sweeps/``). Raises ConfigError on the first problem."""
    source = _resolve_sweep_path(path)
    try:
        check_unique_keys(source, "--config")
        raw = yaml.safe_load(source.read_text())
    except yaml.YAMLError as e:
        raise ConfigError("--config", f"not valid YAML: {' '.join(str(e).split())[:300]}",
                          value=str(path)) from e
    if not isinstance(raw, dict):
        raise ConfigError("--config", "a sweep file is a mapping (base, grid, shared, repeats, ...)",
                          value=str(path), accepted=list(SWEEP_KEYS))
    for k in raw:
        if k not in SWEEP_KEYS:
            raise ConfigError(str(k), "unknown key of a sweep file", value=k, accepted=list(SWEEP_KEYS))
    grid = _overrides("grid", raw.get("grid"))
    if "grid" in raw and not grid:
        raise ConfigError("grid", "is empty: the sweep would be a single trial", value=raw.get("grid"),
                          suggestion="give at least one dotted key with a list of values (e.g. "
                                     "data.init_args.n_train: [32, 64]), or leave `grid` out and use "
                                     "`repeats` / `seeds` for repeated runs of the base config")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"grid: {k}", "must be a non-empty list of values", value=v,
                              suggestion=f"write [{v!r}]" if not isinstance(v, list) else None)
        if len({json.dumps(x, sort_keys=True, default=str) for x in v}) != len(v):
            raise ConfigError(f"grid: {k}", "repeats a value", value=v)
    if "repeats" in raw and "seeds" in raw:
        raise ConfigError("repeats / seeds", "give one of them, not both",
                          value={"repeats": raw["repeats"], "seeds": raw["seeds"]})
    if "repeats" in raw:
        r = raw["repeats"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ConfigError("repeats", "must be an integer >= 1 (the training seeds 0..repeats-1)", value=r)
        seeds = list(range(r))
    elif "seeds" in raw:
        seeds = _int_list("seeds", raw["seeds"])
    else:
        seeds = [None]
    seed_keys = _seed_keys(raw.get("seed_keys"))
    description = raw.get("description") or ""
    root = raw.get("root", "runs")
    if not isinstance(root, str) or not root:
        raise ConfigError("root", "must be a directory path", value=root)
    return SweepSpec(
        name=check_name(name if name is not None else raw.get("name", source.stem),
                        "--name" if name is not None else "name"),
        base=_resolve_base(raw.get("base"), source), root=Path(root),
        shared=_overrides("shared", raw.get("shared")), grid=grid, seeds=seeds, seed_keys=seed_keys,
        resources=_resources(raw.get("resources")), endpoints=_endpoints(raw.get("endpoints")),
        source=source, description=str(description), raw=raw)


def _resolve_sweep_path(value) -> Path:
    from ..launch import CONFIG_DIR

    sweeps = CONFIG_DIR / "sweeps"
    p = Path(value)
    for c in (p, sweeps / str(value), sweeps / f"{value}.yaml"):
        if c.is_file():
            return c.resolve()
    raise ConfigError("--config", "no such sweep file, and not the name of an embedded sweep",
                      value=str(value), accepted=sorted(q.stem for q in sweeps.glob("*.yaml")))


# ----------------------------------------------------------------------------- trials
def _leaf(key: str) -> str:
    tok = [t for t in split_key(key) if not isinstance(t, Selector)]
    return tok[-1] if tok else key


def _short_names(keys: list) -> dict:
    """Shortest unique dotted suffix of each key (``n_train``, ``net.init_args.hidden`` ...)."""
    out = {}
    for k in keys:
        parts = [p for p in re.split(r"[.\[\]]+", k) if p and p != "init_args"]
        for n in range(1, len(parts) + 1):
            cand = ".".join(parts[-n:])
            others = [o for o in keys if o != k]
            if not any(".".join([p for p in re.split(r"[.\[\]]+", o) if p and p != "init_args"][-n:]) == cand
                       for o in others):
                out[k] = cand
                break
        else:
            out[k] = k
    return out


def _value_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return str(v)


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "trial"


def trial_id_for(overrides: dict, seed: Optional[int], short: Optional[dict] = None) -> str:
    """Readable, deterministic id: ``n_train=64-hidden=128-seed=0`` (sanitized; an id longer than
    96 characters keeps its start and ends with a hash of the whole)."""
    short = short or _short_names(list(overrides))
    parts = [f"{short[k]}={_value_text(v)}" for k, v in overrides.items()]
    if seed is not None:
        parts.append(f"seed={seed}")
    text = _sanitize("-".join(parts) if parts else "base")
    if len(text) > _MAX_ID:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        text = text[: _MAX_ID - 11].rstrip("-_.") + "-" + digest
    return text


def model_label_for(overrides: dict) -> str:
    """``hidden=128`` / ``unet3`` from the grid overrides below ``model.``."""
    parts = []
    for k, v in overrides.items():
        if not k.startswith("model."):
            continue
        leaf = _leaf(k)
        parts.append(str(v) if leaf == "preset" else f"{leaf}={_value_text(v)}")
    return ",".join(parts)


def relocate_outputs(cfg: dict, trial_dir: Path, trial_id: str, sweep_name: str) -> dict:
    """Move every output location of a fit config under ``trial_dir`` (in place): the trainer's
    ``default_root_dir``, the loggers' ``save_dir`` (W&B: run name = trial id, group = sweep name),
    and the callbacks' output paths (``dirpath``, ``report_dir``, ...); a path below the base's
    ``default_root_dir`` keeps its relative part (``runs/x/checkpoints`` → ``<trial>/checkpoints``)."""
    trainer = cfg.setdefault("trainer", {}) or {}
    cfg["trainer"] = trainer
    old_root = trainer.get("default_root_dir")
    trial_dir = Path(trial_dir)

    def move(p: Any) -> Any:
        if not isinstance(p, str) or not p:
            return p
        if isinstance(old_root, str) and old_root:
            try:
                return str(trial_dir / Path(p).relative_to(old_root))
            except ValueError:
                pass
        return str(trial_dir / Path(p).name)

    trainer["default_root_dir"] = str(trial_dir)
    loggers = trainer.get("logger")
    for lg in (loggers if isinstance(loggers, list) else [loggers]):
        if not isinstance(lg, dict) or "class_path" not in lg:
            continue
        args = lg.get("init_args") or {}
        lg["init_args"] = args
        args["save_dir"] = str(trial_dir)
        if "wandb" in lg["class_path"].lower():
            args["name"], args["group"] = trial_id, sweep_name
            args.pop("dir", None)
            args.pop("id", None)
            args.pop("version", None)
    callbacks = trainer.get("callbacks")
    for cb in (callbacks if isinstance(callbacks, list) else [callbacks]):
        if isinstance(cb, dict) and isinstance(cb.get("init_args"), dict):
            for k in OUTPUT_PATH_KEYS:
                if k in cb["init_args"]:
                    cb["init_args"][k] = move(cb["init_args"][k])
    return cfg


def load_base(spec: SweepSpec) -> dict:
    check_unique_keys(spec.base, "base")
    try:
        cfg = yaml.safe_load(spec.base.read_text())
    except yaml.YAMLError as e:
        raise ConfigError("base", f"not valid YAML: {' '.join(str(e).split())[:300]}",
                          value=str(spec.base)) from e
    if not isinstance(cfg, dict):
        raise ConfigError("base", "a fit config is a mapping (trainer, model, data, ...)",
                          value=str(spec.base))
    return cfg


def expand_trials(spec: SweepSpec, base: Optional[dict] = None, seed_keys=None) -> list:
    """The trials of a sweep: grid product (first key outermost) × seeds (innermost), each with
    its id, overrides and full fit config (base + shared + grid + seed, outputs relocated).
    Raises ConfigError when an override cannot be applied or two trials get the same id."""
    base = load_base(spec) if base is None else base
    keys = list(spec.grid)
    short = _short_names(keys)
    seed_keys = _seed_keys(spec.seed_keys or seed_keys or ["seed_everything"])
    trials, seen = [], {}
    combos = list(itertools.product(*[spec.grid[k] for k in keys])) if keys else [()]
    for values in combos:
        overrides = dict(zip(keys, values))
        for seed in spec.seeds:
            tid = trial_id_for(overrides, seed, short)
            if tid in seen:
                raise ConfigError("grid", f"two trials get the same id {tid!r} (values that differ "
                                          "only in characters not allowed in a directory name)",
                                  value=[seen[tid], overrides])
            seen[tid] = overrides
            cfg = copy.deepcopy(base)
            for where, ov in (("shared", spec.shared), ("grid", overrides)):
                for k, v in ov.items():
                    try:
                        apply_override(cfg, k, v)
                    except ConfigError as e:
                        raise ConfigError(f"{where}: {e.field} (trial {tid})", e.problem,
                                          **({"value": e.value} if e.has_value else {}),
                                          accepted=e.accepted, suggestion=e.suggestion) from None
            if seed is not None:
                for k, factor in seed_keys.items():
                    apply_override(cfg, k, seed * factor)
            relocate_outputs(cfg, spec.sweep_dir / tid, tid, spec.name)
            trials.append(Trial(trial_id=tid, index=len(trials), overrides=overrides, seed=seed,
                                config=cfg, model_label=model_label_for(overrides),
                                sweep_dir=str(spec.sweep_dir)))
    return trials
