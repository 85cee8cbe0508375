"""Validation of a sweep before anything runs (nothing is written, Ray is not started).

For every trial: its dotted keys exist in the parsed base config (a "did you mean" otherwise),
its full config parses with the ``fit`` parser of
:class:`~lightning_pfd.launch.cli.PFDLightningCLI`, the student's trainable parameters |θ|
are counted (the net built on the ``meta`` device: no memory, no time) and — for a real run —
each distinct datamodule, model and callback is built once, so a value a class refuses fails
now. The first problem raises a :class:`~lightning_pfd.errors.ConfigError` naming the trial and
the key. Then :func:`preflight` runs, for every trial, the cross-component checks ``fit`` runs
before writing (model <-> data shape, the data loaded, every callback's ``check_setup`` against
the trial's data and model: e.g. ``ICRMonitor.num_images`` larger than a trial's training set)
and names every trial that fails.
"""
from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any, Optional

from ..classpath import import_class, instantiate
from ..errors import ConfigError
from ..launch.paths import callback_path
from ..validation import plain_numbers
from .spec import (SweepSpec, Trial, _class_name, _leaf, _seed_keys, check_known_key, expand_trials,
                   load_base)

__all__ = ["validate_trials", "FitParser", "default_seed_keys", "build_net_meta", "preflight"]


def _parse_only_cli():
    """A PFDLightningCLI that builds the ``fit`` parser and parses, nothing else; its parser
    raises instead of printing and exiting."""
    from ..launch.cli import PFDArgumentParser, PFDLightningCLI

    class _ParseError(Exception):
        pass

    class _RaisingParser(PFDArgumentParser):
        def error(self, message, ex=None):  # noqa: D102 - jsonargparse's hook
            raise _ParseError(message)

    class _ParseOnly(PFDLightningCLI):
        def instantiate_classes(self) -> None:
            return

        def _run_subcommand(self, subcommand) -> None:
            return

        def _set_seed(self) -> None:
            return

    return _ParseOnly, _RaisingParser, _ParseError


class FitParser:
    """The ``fit`` parser of :class:`~lightning_pfd.launch.cli.PFDLightningCLI`, built once;
    :meth:`parse` returns the fully parsed config as a dict, or raises ``(message)``."""

    def __init__(self, base: dict):
        import sys

        cls, parser_cls, self.error_type = _parse_only_cli()
        saved = sys.argv
        sys.argv = [saved[0] if saved else "lightning_pfd"]
        try:
            cli = cls(args={"fit": copy.deepcopy(base)}, parser_class=parser_cls)
        except self.error_type as e:
            raise ConfigError("base", "the base config does not parse: " + _condense(str(e))) from None
        finally:
            sys.argv = saved
        self.parser = cli.parser
        self.base = plain_numbers(cli.config.fit.as_dict())
        self.groups: dict = {}  # (top-level group, signature of its raw value) -> parsed value

    def parse(self, cfg: dict) -> dict:
        return plain_numbers(self.parser.parse_object({"fit": copy.deepcopy(cfg)}).fit.as_dict())


def _condense(message: str) -> str:
    from ..launch.cli import condense_error

    text = condense_error(message)
    return re.sub(r'(Parser key "[\w.]+":\s*;?\s*)+', "", text).strip("; ") or text


def default_seed_keys(parsed_base: dict) -> list:
    keys = ["seed_everything"]
    data_args = ((parsed_base.get("data") or {}).get("init_args") or {})
    if "seed" in data_args:
        keys.append("data.init_args.seed")
    model_args = ((parsed_base.get("model") or {}).get("init_args") or {})
    if model_args.get("train_seed") is not None:
        keys.append("model.init_args.train_seed")
    return keys


def _dict_overrides_prefixes(ov: dict) -> tuple:
    """Keys below an override that replaces a class (``X.class_path``) or a whole mapping are
    checked by the parser, not against the base config."""
    out = []
    for k, v in ov.items():
        if k.endswith(".class_path"):
            out.append(k[: -len(".class_path")])
        elif isinstance(v, dict):
            out.append(k)
    return tuple(out)


def _key_in_message(message: str, keys: list) -> Optional[str]:
    names = re.findall(r"Option '([\w.]+)' is not accepted|Parser key \"([\w.]+)\"|"
                       r"does not accept option '([\w.]+)'|key \"([\w.]+)\"", message)
    found = [n for tup in names for n in tup if n]
    found = re.findall(r"(?:^|[\s(;.\]])(\w+): ", message) + found  # "n_train: must be ..." (a class's own check)
    for name in reversed(found):
        for k in keys:
            if k == name or k.endswith("." + name) or _leaf(k) == name.rsplit(".", 1)[-1]:
                return k
    return None


def _trial_error(tid: str, key: Optional[str], where: str, problem: str, n_bad: int, n: int,
                 value: Any = None, has_value: bool = False, accepted=None, suggestion=None) -> ConfigError:
    field_name = f"{where}: {key} (trial {tid})" if key else f"trial {tid}"
    if n_bad > 1:
        problem += f" [{n_bad} of {n} trials fail this check]"
    kw = {"value": value} if has_value else {}
    return ConfigError(field_name, problem, accepted=accepted,
                       suggestion=suggestion or "fix the sweep file (nothing has run)", **kw)


def validate_trials(spec: SweepSpec, trials: Optional[list] = None, construct: bool = True,
                    write_cache: bool = True) -> list:
    """Check every trial before anything runs: its keys exist (with a "did you mean"), its config
    parses with the ``fit`` parser (each distinct top-level group value is parsed once, see
    :func:`_parse_covering`), and each student's |θ| is counted; with ``construct``, each distinct
    datamodule, model (net on the meta device) and callback is also built once, so a value a
    class refuses fails now. Returns the trials (``n_train``, ``n_params``, ``seed`` filled).
    Nothing is written but the cache entries the data setup makes (none with ``write_cache``
    False: a dry run). Raises ConfigError naming the trial and the key."""
    base = load_base(spec)
    parser = FitParser(base)
    seed_keys = _seed_keys(spec.seed_keys or default_seed_keys(parser.base))
    if trials is None:
        trials = expand_trials(spec, base, seed_keys)
    for k in spec.shared:
        try:
            check_known_key(parser.base, k)
        except ConfigError as e:
            raise ConfigError(f"shared: {k}", e.problem, value=e.value, accepted=e.accepted,
                              suggestion=e.suggestion) from None
    for k in seed_keys:
        try:
            check_known_key(parser.base, k)
        except ConfigError as e:
            raise ConfigError(f"seed_keys: {k}", e.problem, value=e.value, accepted=e.accepted,
                              suggestion=e.suggestion) from None
    skip = _dict_overrides_prefixes(spec.shared)
    for t in trials:  # every key of every trial exists (cheap: a walk through the parsed base)
        for k in t.overrides:
            try:
                check_known_key(parser.base, k, skip + _dict_overrides_prefixes(t.overrides))
            except ConfigError as e:
                bad = sum(1 for t2 in trials if k in t2.overrides)
                raise _trial_error(t.trial_id, k, "grid", e.problem, bad, len(trials), value=e.value,
                                   has_value=e.has_value, accepted=e.accepted,
                                   suggestion=e.suggestion) from None
    parsed_all = [(t, _parse_covering(parser, t, trials, spec)) for t in trials]
    _construct(parsed_all, construct, len(trials))
    if construct:
        preflight(parsed_all, spec, write_cache=write_cache)
    for t, parsed in parsed_all:
        sv = parsed.get("seed_everything")
        if t.seed is None and isinstance(sv, int) and not isinstance(sv, bool):
            t.seed = sv  # no repeats: the base config's seed (the id does not show it)
        n = ((parsed.get("data") or {}).get("init_args") or {}).get("n_train")
        t.n_train = int(n) if isinstance(n, int) and not isinstance(n, bool) else None
        if not t.model_label:
            net = ((parsed.get("model") or {}).get("init_args") or {}).get("net")
            t.model_label = (_class_name(net) or "model").rsplit(".", 1)[-1]
    return trials


def _group_signatures(cfg: dict) -> dict:
    return {g: json.dumps(v, sort_keys=True, default=str) for g, v in cfg.items()}


_DIR, _ID = "\x00trial_dir\x00", "\x00trial_id\x00"


def _substitute(obj: Any, pairs: list) -> Any:
    """``obj`` with every string's occurrences of ``old`` replaced by ``new`` (pairs in order)."""
    if isinstance(obj, str):
        for old, new in pairs:
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, dict):
        return {k: _substitute(v, pairs) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_substitute(v, pairs) for v in obj)
    return obj


def _parse_covering(parser: "FitParser", t: Trial, trials: list, spec: SweepSpec) -> dict:
    """The parsed config of ``t``. The fit parser checks the top-level groups (trainer, model,
    data, seed_everything, ...) independently of each other (no linked arguments), so a group
    value that parsed inside one full config is valid in every config: ``t`` is parsed only when
    one of its group values has not been parsed yet (a sweep of 110 trials over 11 data and 10
    model values needs 11 parses), and its parsed groups are reused otherwise. Values are
    compared with the trial's own directory and id replaced by placeholders (every trial writes
    elsewhere; the parser does not look at these paths)."""
    cache = parser.groups
    own = [(str(spec.sweep_dir / t.trial_id), _DIR), (t.trial_id, _ID)]  # the trial's own paths
    sigs = _group_signatures(_substitute(t.config, own))
    if not all((g, sig) in cache for g, sig in sigs.items()):
        try:
            parsed = parser.parse(t.config)
        except parser.error_type as e:
            msg = str(e)
            key = _key_in_message(msg, list(t.overrides) + list(spec.shared))
            where = "grid" if key in t.overrides else "shared" if key else "config"
            bad = sum(1 for t2 in trials if key in t.overrides and key in t2.overrides
                      and t2.overrides[key] == t.overrides[key]) if key else 1
            raise _trial_error(t.trial_id, key, where, _condense(msg), bad, len(trials)) from None
        for g, v in parsed.items():
            cache[(g, sigs.get(g))] = _substitute(v, own)
    back = [(new, old) for old, new in own]
    groups = {g for (g, _sig) in cache}
    return {g: _substitute(cache[(g, sigs.get(g))], back) for g in groups if (g, sigs.get(g)) in cache}


#: the declared type of each top-level component of a fit config
_COMPONENT_BASES = {"model": "lightning.pytorch.LightningModule", "data": "lightning.pytorch.LightningDataModule",
                    "callbacks": "lightning.pytorch.callbacks.Callback"}


def component_base(kind: str) -> type:
    """The class a ``model`` / ``data`` / ``callbacks`` entry must be a subclass of."""
    return import_class(_COMPONENT_BASES[kind])


def _build(spec: Any, base=None, meta_net: bool = False, field: str = "class_path"):
    """Instantiate a parsed class config where a class is declared (``base``, then each
    argument's annotation), type-checked before anything is called
    (:func:`lightning_pfd.classpath.instantiate`); a model's ``net`` on the meta device."""
    return instantiate(spec, base, field, net=build_net_meta if meta_net else None)


def build_net_meta(spec: dict):
    """The net of a parsed config on the meta device (falls back to CPU if a class cannot)."""
    import torch
    from torch import nn

    try:
        with torch.device("meta"):
            return _build(spec, nn.Module, field="net.class_path")
    except ConfigError:
        raise
    except Exception:
        return _build(spec, nn.Module, field="net.class_path")


def _construct(parsed_all: list, construct: bool, n: int) -> None:
    """Count |θ| for every trial and (``construct``) build each distinct data / model / callback
    config once; the first failure names its trial and config group."""
    from ..nets import count_parameters

    seen: dict = {}
    for t, parsed in parsed_all:
        model = parsed.get("model") or {}
        groups = [("model.init_args.net", ((model.get("init_args") or {}).get("net")), "net")]
        if construct:
            groups += [("data", parsed.get("data"), "plain"), ("model", model, "model")]
            cbs = (parsed.get("trainer") or {}).get("callbacks") or []
            groups += [(callback_path(None, c if isinstance(c, dict) else {"class_path": _class_name(c)}), c, "plain")
                       for c in (cbs if isinstance(cbs, list) else [cbs])]
        for where, sub, kind in groups:
            if not isinstance(sub, dict) or "class_path" not in sub:
                continue
            sig = where + json.dumps(sub, sort_keys=True, default=str)
            if sig not in seen:
                try:
                    if kind == "net":
                        seen[sig] = count_parameters(build_net_meta(sub), trainable_only=True)
                    else:
                        _build(sub, component_base("model" if kind == "model" else
                                                   "data" if where == "data" else "callbacks"),
                               meta_net=(kind == "model"))
                        seen[sig] = None
                except Exception as e:  # a class refusing its arguments
                    key = _key_in_message(str(e), list(t.overrides))
                    if key is None and isinstance(e, ConfigError):
                        key = _key_in_message(f"key \"{e.field.split(' ')[0]}\"", list(t.overrides))
                    text = e.one_line() if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
                    bad = sum(1 for t2, p2 in parsed_all if where + json.dumps(
                        _group(p2, where), sort_keys=True, default=str) == sig)
                    raise _trial_error(t.trial_id, key or where, "grid" if key else "config",
                                       f"{where} cannot be built: {' '.join(text.split())[:400]}",
                                       bad, n) from None
            if kind == "net":
                t.n_params = seen[sig]


def _group(parsed: dict, where: str):
    model = parsed.get("model") or {}
    if where == "model.init_args.net":
        return (model.get("init_args") or {}).get("net")
    if where in ("data", "model"):
        return parsed.get(where)
    cbs = (parsed.get("trainer") or {}).get("callbacks") or []
    for c in (cbs if isinstance(cbs, list) else [cbs]):
        if isinstance(c, dict) and callback_path(None, c) == where:
            return c
    return None


#: trainer arguments the pre-flight does not pass on (a trial is one process; nothing is logged)
_PREFLIGHT_SKIP = ("logger", "callbacks", "accelerator", "devices", "strategy", "num_nodes", "plugins",
                   "default_root_dir", "precision", "profiler")


def _preflight_trainer(parsed: dict, callbacks: list):
    """A CPU Trainer with the trial's callbacks and world size 1 (a trial is one process), for
    the callbacks' ``check_setup``; it writes nothing."""
    import warnings

    import lightning.pytorch as pl

    kw = {k: v for k, v in (parsed.get("trainer") or {}).items() if k not in _PREFLIGHT_SKIP}
    # enable_progress_bar stays the trial's: a progress-bar callback with it off is refused by
    # Lightning in the trial as here, and a progress bar with it on (the quickstart) is fine
    kw.update(accelerator="cpu", devices=1, logger=False, callbacks=callbacks, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(**kw)  # (the class-valued arguments are in _PREFLIGHT_SKIP)


def preflight(parsed_all: list, spec: Optional[SweepSpec] = None, max_listed: int = 20,
              write_cache: bool = True) -> None:
    """Every trial's cross-component validation (:func:`lightning_pfd.launch.cli.check_components`,
    what ``fit`` checks before writing), on the trial's own data, model and callbacks; raises one
    :class:`ConfigError` listing every failing trial (the first ``max_listed``). Each distinct
    datamodule is set up once (its cache writes are made only when every trial passes, as in
    ``fit``); models are built once per distinct config."""
    from ..cache import deferred_writes, write_deferred
    from ..launch.cli import check_components

    def sig(obj) -> str:
        return json.dumps(obj, sort_keys=True, default=str)

    own = (lambda t: [(str(spec.sweep_dir / t.trial_id), _DIR), (t.trial_id, _ID)]) if spec else (lambda t: [])
    order = sorted(parsed_all, key=lambda tp: sig(_substitute(tp[1].get("data"), own(tp[0]))))
    failures: list = []
    data_sig, dm, models = None, None, {}
    with deferred_writes() as pending, _quiet_lightning():
        for t, parsed in order:
            try:
                d_sig = sig(_substitute(parsed.get("data"), own(t)))
                if d_sig != data_sig:  # one datamodule alive at a time (set up once)
                    data_sig, dm = d_sig, (_build(parsed.get("data"), component_base("data"))
                                           if parsed.get("data") else None)
                m_sig = sig(_substitute(parsed.get("model"), own(t)))
                if m_sig not in models:
                    if sum(_numel(m) for m in models.values()) > 50_000_000:
                        models.clear()  # bounded memory for large nets
                    models[m_sig] = _build(parsed.get("model"), component_base("model"))
                entries = (parsed.get("trainer") or {}).get("callbacks") or []
                entries = entries if isinstance(entries, list) else [entries]
                cbs = [_build(e, component_base("callbacks")) for e in entries]
                trainer = _preflight_trainer(parsed, cbs)
                check_components(trainer, models[m_sig], dm, configured=zip(cbs, entries))
            except ConfigError as e:
                failures.append((t.trial_id, e.one_line()))
            except Exception as e:  # noqa: BLE001 - a class failing on this trial's combination
                failures.append((t.trial_id, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
    if failures:
        rank = {t.trial_id: i for i, (t, _p) in enumerate(parsed_all)}
        failures.sort(key=lambda f: rank[f[0]])
        listed = "\n".join(f"  trial {tid}: {msg}" for tid, msg in failures[:max_listed])
        more = f"\n  ... and {len(failures) - max_listed} more" if len(failures) > max_listed else ""
        raise ConfigError("sweep", f"{len(failures)} of {len(parsed_all)} trials fail the checks `fit` runs "
                          f"before training (nothing has run):\n{listed}{more}",
                          suggestion="fix the sweep file or the base config for these trials")
    if write_cache:
        write_deferred(pending)


@contextlib.contextmanager
def _quiet_lightning():
    """Lightning's INFO lines ("GPU available", tips) once per pre-flight Trainer: not shown."""
    import logging

    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _numel(module) -> int:
    try:
        return sum(p.numel() for p in module.parameters())
    except Exception:  # noqa: BLE001
        return 0
