"""LightningCLI for ``python -m lightning_pfd fit|validate|test|predict`` and the sweep trials,
validated before anything is written.

The order of a ``fit`` is: the command line (embedded config names resolved, ``--key -1e-3``
joined, ``--overwrite`` taken off; no ``--config``: the embedded quickstart) → parse (no
abbreviations) → instantiate model, data, trainer, callbacks (nothing is written yet) →
:meth:`PFDLightningCLI.validate_run` → ``trainer.fit``. The validation phase checks everything
that can be checked before training: model ↔ data shape, the checkpoint to resume (exists,
verified digest, hyper-parameters compatible), an earlier run in the same checkpoint directory,
the data (finite, in range: the datamodule's ``setup``), and every callback's
``check_setup(trainer, model, datamodule)``. Only then are loggers started and ``config.yaml``
written (atomically), so a run that fails never touches the files of an earlier run. W&B runs
offline when no credentials exist (:func:`ensure_wandb_mode`). User errors: one block, exit
status 2 (:func:`lightning_pfd.launch.run_guarded`).
"""
from __future__ import annotations

import contextvars
import errno
import inspect
import os
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Optional, Sequence

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from ..cache import check_cache_writable, deferred_writes, write_deferred
from ..callbacks.checkpoint import (continue_loggers, install_data_fingerprint, install_verified_io,
                                    run_artifacts)
from ..callbacks.wandb_setup import LogConfigCallback, has_wandb_credentials
from ..atomic import atomic_write
from ..checkpoint import load_checkpoint, truncated_epoch
from ..contracts import check_data_shape
from ..classpath import import_class
from ..errors import ConfigError, did_you_mean, suggest_option
from ..locks import acquire as acquire_lock
from ..validation import plain_numbers
from . import CONFIG_DIR, LIGHTNING_SUBCOMMANDS, PROG, RESUMED_CSV_WARNING, debug_enabled
from .fit_help import parser_kwargs
from .paths import at_config_path, callback_path, check_callbacks, config_path, nested_paths, refused_at
from .run_dir import RUN_DIR_HELP
from .run_dir import relocate as relocate_outputs
from .run_checks import (check_monitored_keys, check_wandb_online, finished_run,
                         share_checkpoint_dir)
from .run_safety import (check_run_length, check_unique_keys, epoch_end_last_checkpoints,
                         probe_output_places, remove_unfinished_writes, set_aside_earlier_checkpoints)

__all__ = ["PFDLightningCLI", "PFDArgumentParser", "RunConfigCallback", "condense_error", "run_lightning_cli",
           "resolve_config_path", "join_negative_values", "ensure_wandb_mode", "SUBCOMMANDS", "RunFinished",
           "check_components", "needs_default_config", "rewrite_configs", "disk_error", "DISK_ERRNOS", "RUNNING"]

SUBCOMMANDS = LIGHTNING_SUBCOMMANDS
_NOISE = ("Expected a <class 'NoneType'>", "Given value", "Subtypes:", "Errors:",
          "Does not validate against any of the Union subtypes", "Not a valid subclass",
          "Subclass types expect", "a class path (str)", "a dict with class_path",
          "a dict without class_path", "a class name")


def condense_error(message: str) -> str:
    """The lines of a jsonargparse error a person needs: for nested union / class errors the
    innermost messages (e.g. "lr: must be > 0, got -0.001"), without the echoed config."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not any("Does not validate against any of the Union subtypes" in ln for ln in lines):
        return " ".join(lines[:3])
    keep = []
    for ln in lines:
        ln = ln.lstrip("- ").strip()
        if not ln or any(ln.startswith(n) or n in ln for n in _NOISE):
            continue
        if ln not in keep:
            keep.append(ln)
    return "; ".join(keep[:4]) or lines[0]


#: the arguments PFDLightningCLI is parsing (for the names in a parser error)
_PARSING: contextvars.ContextVar = contextvars.ContextVar("pfd_parsing_args", default=None)


class PFDArgumentParser(LightningArgumentParser):
    """Parser whose errors are one short block (no usage dump), with a "did you mean" for an
    unknown option. ``--debug`` / ``LIGHTNING_PFD_DEBUG=1`` restores jsonargparse's full output."""

    def error(self, message: str, ex=None):
        if debug_enabled():  # the traceback of the refusal, then jsonargparse's own report
            if ex is not None and ex.__traceback__ is not None:
                traceback.print_exception(ex, file=sys.stderr)
            else:
                sys.stderr.write("Traceback (most recent call last):\n")
                traceback.print_stack(file=sys.stderr)
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        message = re.sub(r'Parser key "(\w+)"',
                         lambda m: f'Parser key "{qualified_key(m.group(1), self.given_args())}"', message)
        text = condense_error(message)
        hint = self._hint(parser, message)
        sys.stderr.write(f"{prog}: error: {text}\n" + (f"  hint: {hint}\n" if hint else "")
                         + f"  (options: {prog} --help)\n")
        sys.exit(2)

    @staticmethod
    def given_args() -> list:
        """The arguments being parsed: those handed to the CLI, else ``sys.argv``."""
        args = _PARSING.get()
        return list(sys.argv[1:] if args is None else args)

    @staticmethod
    def _hint(parser, message: str) -> Optional[str]:
        renamed = _renamed_hint(message)
        if renamed:
            return renamed
        m = re.search(r"Option '(\w+)' is not accepted", message)
        if m:
            return _not_accepted_hint(m.group(1))
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            opt = m.group(1).split("=", 1)[0]
            close = suggest_option(opt, _option_names(parser))
            return f"did you mean {close}? (options are never abbreviated)" if close else None
        m = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
        if m:
            return _attribute_hint(m.group(1), m.group(2))
        m = re.search(r'Parser key "([^"]+)"', message)
        if m:
            return _value_hint(m.group(1), message)
        if "Problems parsing config" in message or "Unexpected config" in message:
            cfg = _argv_value("config") or _argv_value("c")
            if cfg and "Unexpected config" in message and _is_yaml_list(cfg):
                return (f"{cfg} is a list of callbacks, not a run config: append it with "
                        f"--trainer.callbacks+={cfg}")
            return f"in the config file {cfg!r}" if cfg else None
        return None


def _entries(node, path: str):
    """``(config path, class_path, init_args)`` of every class entry below ``node`` (parsed YAML)."""
    if isinstance(node, dict):
        if isinstance(node.get("class_path"), str) and isinstance(node.get("init_args"), dict):
            yield path, node["class_path"], node["init_args"]
        for k, v in node.items():
            yield from _entries(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for v in node:
            name = v.get("class_path", "").rsplit(".", 1)[-1] if isinstance(v, dict) else ""
            yield from _entries(v, f"{path}[{name}]" if name else path)


def _not_accepted_hint(name: str) -> Optional[str]:
    """Where a config file sets the unknown argument ``name`` (file, config path) and the closest
    argument the named class accepts (its signature is read; nothing is called)."""
    import inspect

    import yaml

    for cfg in _argv_values("config") + _argv_values("c"):
        try:
            text = Path(cfg).read_text() if Path(cfg).is_file() else ""
            data = yaml.safe_load(text) if text else None
        except (OSError, yaml.YAMLError):
            continue
        for where, cls_path, args in _entries(data, ""):
            if name not in args:
                continue
            try:
                target = import_class(cls_path)
                params = inspect.signature(target.__init__ if isinstance(target, type) else target).parameters
            except Exception:  # noqa: BLE001 - a hint only: the error itself stands
                params = {}
            close = did_you_mean(name, [p for p in params if p not in ("self", "args", "kwargs")])
            line = next((i + 1 for i, t in enumerate(text.splitlines())
                         if re.search(rf"\b{re.escape(name)}\s*:", t)), None)
            at = f"{cfg}" + (f", line {line}" if line else "")
            return f"{where}.init_args.{name} in {at}" + (f": did you mean {close}?" if close else "")
    return None


#: options of earlier releases: old name -> (new name, what to write instead)
RENAMED_OPTIONS = {"precond": ("family", "--model.init_args.family edm (or vp, ve; in a config "
                                         "file: `family: edm` under model.init_args)")}


def _renamed_hint(message: str) -> Optional[str]:
    """The hint for an option that an earlier release had under another name."""
    for old, (new, how) in RENAMED_OPTIONS.items():
        if re.search(rf"(?<![\w.])(?:[\w.]*\.)?{old}\b", message) and ("not accepted" in message
                                                                  or "unrecognized" in message
                                                                  or "Unexpected" in message
                                                                  or "No action" in message):
            return f"`{old}` is now called `{new}`: {how}"
    return None


def qualified_key(key: str, argv: Sequence[str]) -> str:
    """The config path of a bare argument name jsonargparse reports for a class given by
    ``class_path`` (``"width"`` -> ``"model.init_args.width"``): the one option typed with that
    name (options override the config files), else the one place a ``--config`` file sets it;
    ``key`` itself when not unique."""
    if "." in key:
        return key
    typed = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")
             and a[2:].split("=", 1)[0].endswith("." + key)}
    if len(typed) == 1:  # the command line comes after the config files
        return typed.pop()
    found = set(typed)
    for path in _argv_values("config", argv) + _argv_values("c", argv):
        if os.path.isfile(path):
            found |= set(_config_paths(path, key))
    return found.pop() if len(found) == 1 else key


def _config_paths(path: str, key: str) -> list:
    """Where the YAML file ``path`` sets the init argument ``key`` of the model, the data, a
    callback, or a class nested in one of their arguments (a net, a monitor's evaluation)."""
    import yaml

    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(cfg, dict):
        return []
    paths = [p for top in ("model", "data") for p in nested_paths(top + ".init_args", cfg.get(top), key)]
    callbacks = (cfg.get("trainer") or {}).get("callbacks") if isinstance(cfg.get("trainer"), dict) else None
    for cb in callbacks if isinstance(callbacks, list) else []:
        if isinstance(cb, dict):
            paths += nested_paths(callback_path(None, cb), cb, key)
    return paths


def _value_hint(key: str, message: str) -> Optional[str]:
    """Which value of ``key`` the parser refused: the one jsonargparse reports ("Given value:"),
    said to come from the command line when it was typed there (a key may be given twice); for
    a declared set of choices (``Literal``), the accepted one closest to it."""
    m = re.search(r"Given value: (.*)", message)
    refused = m.group(1).strip() if m else None
    typed = _argv_values(key)
    choices = re.search(r"typing\.Literal\[(.*?)\]", message)  # a declared set of choices
    got = re.search(r"Got value: (\S+)", message)
    value = refused if refused is not None else (got.group(1) if got else (typed[-1] if typed else None))
    if choices and value is not None:
        accepted = re.findall(r"'([^']*)'", choices.group(1))
        close = did_you_mean(value, accepted)
        if close is not None:
            return f"did you mean {close!r}? (accepted: {', '.join(accepted)})"
    if refused is not None and refused in typed:
        return f"the value given for --{key} was {refused!r}"
    if refused is not None:
        return f"the value {refused!r} of {key} (from the config file)"
    return f"the value given for --{key} was {typed[-1]!r}" if typed else None


def _argv_values(key: str, argv: Optional[Sequence[str]] = None) -> list:
    """Every value given for ``--key`` (``-k`` for a one-letter key) in ``argv`` (default: this
    process's command line), in order."""
    argv = list(sys.argv[1:] if argv is None else argv)
    found = []
    for i, a in enumerate(argv):
        if a == f"--{key}" or (len(key) == 1 and a == f"-{key}"):
            if i + 1 < len(argv):
                found.append(argv[i + 1])
        elif a.startswith(f"--{key}="):
            found.append(a.split("=", 1)[1])
    return found


def _trainer_hint() -> str:
    """The ``--trainer.*`` options of the command line with the value that is used (the last
    one of a key given twice), for a refusal of Lightning's Trainer."""
    given = {}
    for a in sys.argv[1:]:
        if a.startswith("--trainer."):
            key = a.split("=", 1)[0][2:]
            values = _argv_values(key)
            given[key] = values[-1] if values else None
    if not given:
        return "fix the trainer value in the config"
    return "check " + ", ".join(f"--{k} {v}" if v is not None else f"--{k}" for k, v in given.items()) \
        + " (given on the command line)"


def _argv_value(key: str) -> Optional[str]:
    """The value given for ``--key`` on this process's command line, if any (the last one when
    it is given twice: the one the parser keeps)."""
    values = _argv_values(key)
    return values[-1] if values else None


def _is_yaml_list(path: str) -> bool:
    try:
        import yaml

        return isinstance(yaml.safe_load(Path(path).read_text()), list)
    except Exception:
        return False


def _option_names(parser) -> set:
    """The option strings a parser's help lists (``--trainer.max_epochs``, ``-c``, ...)."""
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w.\-]*)", parser.format_help()))


def _attribute_hint(module: str, name: str) -> Optional[str]:
    """"did you mean" for a class_path whose last part is misspelt."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
    close = did_you_mean(name, names)
    return f"did you mean {module}.{close}?" if close else f"{module} provides: {sorted(names)[:12]}"


class RunConfigCallback(LogConfigCallback):
    """Writes ``config.yaml`` atomically (tmp file + rename) on rank 0, after validation, and logs
    the parsed config to every logger.

    A ``config.yaml`` of an earlier run in the same log directory (a resume, possibly with
    changed values) that differs from this run's is replaced only once this run has written a
    checkpoint: until then it still describes the newest checkpoint (a run that fails before
    its first checkpoint, e.g. on a full disk, leaves it as it was)."""

    _pending = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # a broadcast: every rank must take part
        if trainer.is_global_zero:
            if log_dir is not None and self.save_to_log_dir:
                data = self.parser.dump(self.config, skip_none=False).encode()
                target = Path(log_dir) / self.config_filename
                if target.is_file() and target.read_bytes() != data:
                    self._pending = (target, data, time.time_ns())
                else:
                    atomic_write(target, data)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def _write_pending(self, trainer) -> None:
        """Replace the earlier ``config.yaml`` once a checkpoint of this run is on disk."""
        if self._pending is None:
            return
        target, data, t0 = self._pending
        for cb in trainer.checkpoint_callbacks:
            paths = [getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", "")]
            if any(p and os.path.isfile(p) and os.stat(p).st_mtime_ns >= t0 for p in paths):
                atomic_write(target, data)
                self._pending = None
                return

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._write_pending(trainer)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write_pending(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._write_pending(trainer)


#: the parts of the config built one at a time (each with its config path), in the order
#: jsonargparse builds them (the callbacks, one level deeper, first)
BUILT_ALONE = ("trainer.callbacks", "model", "data")


def _config_error_in(error: BaseException) -> Optional[ConfigError]:
    """The first ConfigError in ``error``'s chain of causes (``error`` itself included)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ConfigError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class PFDLightningCLI(LightningCLI):
    """LightningCLI for lightning_pfd (any LightningModule / LightningDataModule by class_path).

    Args:
        overwrite: allow a fresh ``fit`` into a checkpoint directory that holds an earlier run's
            checkpoints (they are replaced as the new run writes its own).
        stop_when_finished: ``fit --ckpt_path`` of a run that already reached ``max_epochs`` /
            ``max_steps`` raises :class:`RunFinished` before any logger starts (the command
            line prints it and exits 0) instead of an empty fit that rewrites the run's logs.
        allow_data_change: ``fit --ckpt_path`` whose data differ from the checkpoint's (a
            datamodule argument, a file it reads): continue on the new data (the differences
            are printed) instead of refusing.
        allow_optimizer_change: ``fit --ckpt_path`` with another optimizer or LR-schedule class
            than the checkpoint's: continue from its weights with a fresh optimizer and schedule
            state (printed) instead of refusing.
    """

    def __init__(self, args=None, run: bool = True, overwrite: bool = False,
                 stop_when_finished: bool = False, allow_data_change: bool = False,
                 allow_optimizer_change: bool = False, **kwargs):
        kwargs.setdefault("parser_kwargs", parser_kwargs(PROG, SUBCOMMANDS))  # fit_help.py
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("save_config_callback", RunConfigCallback)
        self.pfd_parser_class = kwargs.pop("parser_class", PFDArgumentParser)  # see init_parser
        self.overwrite = bool(overwrite)
        self.stop_when_finished = bool(stop_when_finished)
        self.allow_data_change = bool(allow_data_change)
        self.allow_optimizer_change = bool(allow_optimizer_change)
        self.resume_checkpoint: Optional[dict] = None
        self.resolved_ckpt_path: Optional[str] = None
        self.configured_callbacks: list = []  # (callback, its config entry): see check_callbacks
        super().__init__(model_class=None, datamodule_class=None, subclass_mode_model=True,
                         subclass_mode_data=True, args=args, run=run, **kwargs)

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        """The main and every subcommand's parser: a :class:`PFDArgumentParser` (LightningCLI's
        ``parser_class`` argument exists only from Lightning 2.6) with ``--config``."""
        import lightning.pytorch as pl
        from jsonargparse import ActionConfigFile

        kwargs.setdefault("dump_header", [f"lightning.pytorch=={pl.__version__}"])
        parser = self.pfd_parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="Path to a configuration file in json or yaml format.")
        return parser

    def instantiate_classes(self) -> None:
        """A class that refuses its arguments raises a ConfigError naming them, not a nested
        jsonargparse union error that echoes the whole config. Each callback of the config, the
        model and the datamodule are built one at a time first (:meth:`build_alone`), so the
        argument a class names gets the config path of the component that refused it
        (:func:`config_path`); then LightningCLI builds the rest and the Trainer, taking the
        built ones as they are (jsonargparse keeps an object where a class is expected)."""
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        given = {key: cfg.get(key) for key in BUILT_ALONE if cfg.get(key) is not None}
        try:
            built = self._build_components(given)  # self.config untouched while they are built:
            try:  # Lightning saves the model's / datamodule's hparams from its dump
                for key, value in built.items():
                    cfg[key] = value
                super().instantiate_classes()
            finally:  # config.yaml is written from the parsed config
                for key, value in given.items():
                    cfg[key] = value
        except ConfigError as e:
            raise at_config_path(e) from e.__cause__
        except (ValueError, TypeError) as e:
            inner = _config_error_in(e)
            if inner is not None:  # jsonargparse wraps what a class raised while it is built
                raise at_config_path(inner) from inner.__cause__
            m = re.search(r"class_path='([\w.]+)'", str(e))
            field = f"{m.group(1).rsplit('.', 1)[-1]} ({m.group(1)})" if m else (self.subcommand or "config")
            raise ConfigError(field, condense_error(str(e)),
                              suggestion="fix the value in the config or on the command line") from e
        except Exception as e:  # Lightning's own refusals while building the Trainer
            if type(e).__name__ == "MisconfigurationException":
                raise ConfigError("trainer", str(e).strip().splitlines()[0], suggestion=_trainer_hint()) from e
            if isinstance(e, RuntimeError) and "more than one stateful callback" in str(e):
                raise ConfigError(self._duplicate_callback(str(e)),
                                  "the same callback appears twice with the same settings (it would "
                                  "log the same keys and share one checkpoint state)",
                                  suggestion="remove the duplicate, or give the second one its own "
                                             "`name` (monitors) / `dirpath` or `monitor` (checkpoints)") from e
            raise

    def _duplicate_callback(self, message: str) -> str:
        """The config path of a callback whose checkpoint state key another configured callback
        has too (Lightning's "more than one stateful callback" refusal), named as configured."""
        seen = set()
        for cb, entry in self.configured_callbacks:
            key = getattr(cb, "state_key", None)
            if key in seen:
                return callback_path(cb, entry)
            seen.add(key)
        kind = re.search(r"type `(\w+)`", message)
        return callback_path(None, {"class_path": kind.group(1)} if kind else None)

    def _build_components(self, given: dict) -> dict:
        """The callbacks, model and datamodule of ``given`` (parsed config entries), each built on
        its own under its config path; ``self.configured_callbacks``: (callback, its entry)."""
        built = {}
        callbacks = given.get("trainer.callbacks")
        if callbacks is not None:
            entries = callbacks if isinstance(callbacks, list) else [callbacks]
            objs = [self.build_alone("trainer.callbacks", [e], callback_path(e, e), e)[0] for e in entries]
            self.configured_callbacks = list(zip(objs, entries))
            built["trainer.callbacks"] = objs if isinstance(callbacks, list) else objs[0]
        for key in ("model", "data"):
            if key in given:
                built[key] = self.build_alone(key, given[key], f"{key}.init_args", given[key])
        return built

    def build_alone(self, key: str, value, where: str, entry=None):
        """The component ``value`` of the config at ``key``, built by this CLI's parser (its
        instantiators: Lightning's for model and datamodule) with nothing else of the config; a
        ConfigError it raises (wrapped by jsonargparse or not) gets the config path ``where``."""
        from jsonargparse import Namespace

        part = Namespace()
        part[key] = value
        if self.subcommand:
            part = Namespace(subcommand=self.subcommand, **{self.subcommand: part})
        instantiate = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes  # < 4.49
        try:
            out = instantiate(part)
        except Exception as e:
            inner = _config_error_in(e)  # jsonargparse wraps what a class raised while it is built
            if inner is None:
                raise
            raise at_config_path(inner, where, entry) from inner.__cause__
        return (out[self.subcommand] if self.subcommand else out)[key]

    def add_arguments_to_parser(self, parser) -> None:
        """``--run_dir PATH``: every output of the run in one directory (:mod:`.run_dir`)."""
        parser.add_argument("--run_dir", type=Optional[str], default=None, help=RUN_DIR_HELP)

    def parse_arguments(self, parser, args) -> None:
        """Parse, then set ``ckpt_path`` aside until :meth:`before_instantiate_classes`: given a
        checkpoint file, Lightning (>= 2.5) would silently replace the command line's model
        arguments by the checkpoint's while the config is parsed; here the two are compared in
        :meth:`validate_run` instead (and the file is verified before it is read)."""
        token = _PARSING.set(None if args is None else list(args))
        try:
            super().parse_arguments(parser, args)
        finally:
            _PARSING.reset(token)
        plain_numbers(self.config)  # classes get built-in numbers (hparams, checkpoints, saved configs)
        if isinstance(args, dict):  # jsonargparse writes parsed values back into a given dict
            plain_numbers(args)
        sub = self.config.get("subcommand")
        cfg = self.config.get(sub) if sub else None
        target = self.config if cfg is None else cfg  # run=False: no subcommand
        if target.get("run_dir") is not None:  # before any path is used
            relocate_outputs(target, target["run_dir"])
        self._given_ckpt_path = cfg.get("ckpt_path") if cfg is not None else None
        if self._given_ckpt_path is not None:
            cfg["ckpt_path"] = None

    def before_instantiate_classes(self) -> None:
        given = getattr(self, "_given_ckpt_path", None)
        if given is not None:
            self.config[self.config["subcommand"]]["ckpt_path"] = given

    # -- the validation phase ------------------------------------------------------------------
    def _check_shapes(self) -> None:
        with refused_at(None):  # model.net -> model.init_args.net
            check_data_shape(self.model, self.datamodule)

    def _ckpt_arg(self) -> Optional[str]:
        cfg = self.config.get(self.subcommand) if self.subcommand else None
        value = cfg.get("ckpt_path") if cfg is not None else None
        return None if value in (None, "") else str(value)

    def _resolve_ckpt(self, value: str) -> str:
        """``last`` / ``best`` / a path → an existing file, or a ConfigError."""
        if value not in ("last", "best"):
            return value
        dirs = [cb.dirpath for cb in self.trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
        if not dirs:
            raise ConfigError("ckpt_path", f"{value!r} needs a checkpoint callback with a dirpath",
                              value=value, suggestion="give the checkpoint file's path instead")
        if value == "last":
            found = [p for d in dirs for p in Path(d).glob("last*.ckpt") if p.is_file()]
        else:
            found = [p for d in dirs for p in Path(d).glob("*.ckpt")
                     if p.is_file() and not p.name.startswith("last")]
        if not found:
            raise ConfigError(
                "ckpt_path", f"no {value} checkpoint in {dirs}: the run ended (or was killed) before "
                "its first epoch finished, or it wrote elsewhere", value=value,
                suggestion="start a new run without --ckpt_path, or give a checkpoint file's path")
        return str(max(found, key=lambda p: p.stat().st_mtime))

    def _check_resume(self) -> None:
        value = self._ckpt_arg()
        if value is None:
            self._check_earlier_run()
            return
        path = self._resolve_ckpt(value)
        ckpt = load_checkpoint(path)  # CheckpointError: missing, empty, foreign, damaged
        changes = getattr(self.model, "resume_changes", None)
        if callable(changes):  # refuses architecture changes now; the others are printed on load
            params = inspect.signature(changes).parameters
            extra = {"name": lambda k: config_path(f"model.{k}")} if "name" in params else {}
            if "allow_optimizer_change" in params:
                extra["allow_optimizer_change"] = self.allow_optimizer_change
                self.model.allow_optimizer_change = self.allow_optimizer_change
            changes(ckpt, source=path, **extra)
        if self.subcommand == "fit":
            self._check_data_unchanged(ckpt, path)
        self.resume_checkpoint, self.resolved_ckpt_path = ckpt, path
        done = finished_run(ckpt, self.trainer.max_epochs, self.trainer.max_steps) \
            if self.subcommand == "fit" and self.stop_when_finished else None
        if done is not None:
            from .interrupts import missing_report_line

            missing = missing_report_line(self.trainer, PROG, Path(path).stat().st_mtime)
            raise RunFinished(f"[lightning_pfd] nothing to train: the run of {path} is already finished "
                              f"({done}); its checkpoints and logs are unchanged. To train further, "
                              "raise --trainer.max_epochs (or --trainer.max_steps)."
                              + (f"\n{missing}" if missing else ""))
        self.config_init[self.subcommand]["ckpt_path"] = path  # what the subcommand receives
        verb = "resuming from" if self.subcommand == "fit" else "weights from"
        print(f"[lightning_pfd] {verb} {path} (epoch {ckpt.get('epoch')}, "
              f"step {ckpt.get('global_step')}; content digest verified)", flush=True)
        cut = truncated_epoch(ckpt)
        if cut is not None:
            print(f"[lightning_pfd] warning: this checkpoint was written inside epoch {cut[0]}, after {cut[1]} "
                  "of its steps (a max_time / max_steps stop, or a step-interval checkpoint); Lightning resumes "
                  "at the next epoch, so the rest of that epoch is not trained and it is not measured: the "
                  "continuation differs from an uninterrupted run (a checkpoint at an epoch end, e.g. after "
                  "SIGTERM, resumes exactly)", file=sys.stderr, flush=True)

    def _check_data_unchanged(self, ckpt: dict, path: str) -> None:
        """A resume trains on the data of its checkpoint: a changed datamodule argument or a
        replaced data file is refused (``--allow-data-change``: reported, then accepted)."""
        from ..callbacks.checkpoint import DATA_KEY
        from ..data.base import data_changes, data_fingerprint

        changes = data_changes(ckpt.get(DATA_KEY) or {}, data_fingerprint(self.datamodule),
                               name=lambda k: config_path(f"data.{k}"))
        if not changes:
            return
        listed = "; ".join(changes[:6]) + ("; ..." if len(changes) > 6 else "")
        if not self.allow_data_change:
            raise ConfigError("data", f"differs from the data the checkpoint {path} was trained on: "
                              f"{listed}", suggestion="resume with the checkpoint's data values and files, "
                              "start a new run (another dirpath, or --overwrite), or pass "
                              "--allow-data-change to continue training on the new data")
        print(f"[lightning_pfd] --allow-data-change: training continues on changed data: {listed}",
              file=sys.stderr, flush=True)

    def _check_earlier_run(self) -> None:
        if self.subcommand != "fit" or self.overwrite:
            return
        found = run_artifacts(self.trainer)
        if found:
            raise ConfigError(
                callback_path(self.trainer.checkpoint_callback, arg="dirpath"),
                f"an earlier run's checkpoints are there ({', '.join(found[:3])}"
                + (", ..." if len(found) > 3 else "") + "); a fresh fit would overwrite them",
                suggestion="resume it with --ckpt_path last, write elsewhere (--run_dir PATH moves "
                           "every output), or pass --overwrite to replace it")

    def _check_data(self) -> None:
        """Load the data now (the datamodule's checks: files, shapes, finite and in range); a
        loader's own ValueError / unpickling error becomes one ConfigError naming the data."""
        import pickle

        dm = self.datamodule
        if dm is None:
            import lightning.pytorch as pl

            own = type(self.model).train_dataloader is not pl.LightningModule.train_dataloader
            if self.subcommand == "fit" and not own:
                raise ConfigError("data", "no data: the config has no `data:` section and the model "
                                  f"{type(self.model).__name__} brings no train_dataloader",
                                  suggestion="add a data section, e.g. start from an embedded config and "
                                             "override it: --config quickstart --config yours.yaml")
            return
        try:
            dm.prepare_data()
            dm.setup("fit" if self.subcommand == "fit" else self.subcommand)
        except ConfigError:
            raise
        except (ValueError, OSError, pickle.UnpicklingError, RuntimeError) as e:
            first = " ".join(str(e).split())[:400] or type(e).__name__
            raise ConfigError(f"data ({type(dm).__name__})", f"cannot be loaded: {first}",
                              suggestion="check data.init_args (path, file format, keys, dtype)") from e

    def _check_hparams_merge(self) -> None:
        """Lightning refuses, after creating the loggers, keys that module and datamodule both
        save with different values: refuse them here, before anything is written."""
        dm = self.datamodule
        if dm is None or not hasattr(dm, "hparams_initial") or not hasattr(self.model, "hparams_initial"):
            return
        a, b = dict(self.model.hparams_initial), dict(dm.hparams_initial)
        clash = sorted(k for k in set(a) & set(b)
                       if k != "_class_path" and (type(a[k]) is not type(b[k]) or repr(a[k]) != repr(b[k])))
        if clash:
            raise ConfigError(
                "model / data", "the same hyper-parameter names have different values in the "
                "model and the data: " + "; ".join(f"{k}: model {a[k]!r}, data {b[k]!r}" for k in clash),
                suggestion="make them equal (one PF-ODE grid for student and teacher, one seed)")

    def _check_callbacks(self) -> None:
        check_callbacks(self.trainer, self.model, self.datamodule, self.configured_callbacks)

    def _check_output_paths(self) -> None:
        """Every place the run writes can be created and written (run_safety.py): no part of a
        path is a regular file, no name is too long, no directory is read-only."""
        probe_output_places(self.trainer)

    def _lock_run_dirs(self) -> list:
        """``fit``: one writer per checkpoint directory (:mod:`lightning_pfd.locks`), taken by the
        launching process only (not by DDP ranks > 0, which run this command again)."""
        if self.subcommand != "fit" or not _launching_process():
            return []
        locks, entries = [], {id(cb): entry for cb, entry in self.configured_callbacks}
        for cb in self.trainer.checkpoint_callbacks:
            d = getattr(cb, "dirpath", None)
            if d:
                lock = acquire_lock(d, "run", callback_path(cb, entries.get(id(cb)), "dirpath"))
                if lock is not None:
                    locks.append(lock)
        return locks

    def validate_run(self) -> None:
        """Every check that needs no training, before any file is written (see module doc)."""
        RUNNING["trainer"] = self.trainer  # for the message of a run stopped by a signal
        if self.subcommand == "fit":
            check_run_length(self.trainer)
        self._check_shapes()
        for line in share_checkpoint_dir(self.trainer) + epoch_end_last_checkpoints(self.trainer):
            print(f"[lightning_pfd] {line}", flush=True)  # one checkpoint folder; last.ckpt every epoch
        self._check_output_paths()
        check_cache_writable()
        locks = self._lock_run_dirs()  # a second writer fails here, before anything else
        try:
            self._check_resume()
            with deferred_writes() as pending:  # a run that fails here leaves no cache entry behind
                self._check_data()
                self._check_shapes()  # the data shape is known for sure after setup
                self._check_hparams_merge()
                self._check_callbacks()
                check_monitored_keys(self.trainer)
                check_wandb_online(self.trainer)
        except BaseException:
            for lock in locks:  # and no directory that the lock created
                lock.release(remove_created_dir=True)
            raise
        write_deferred(pending)
        install_verified_io(self.trainer)
        if self.subcommand == "fit":
            install_data_fingerprint(self.trainer, self.datamodule)
        removed = remove_unfinished_writes(self.trainer) if locks else []  # the run's lock is held:
        if removed:  # no writer of this run is active, its unfinished checkpoint writes are garbage
            print(f"[lightning_pfd] removed {len(removed)} unfinished checkpoint write(s) of an "
                  f"interrupted run: {', '.join(removed[:3])}", flush=True)
        if self.subcommand == "fit" and self.overwrite and self.resume_checkpoint is None \
                and _launching_process():  # every check passed: the earlier run's files go aside
            for line in set_aside_earlier_checkpoints(self.trainer):
                print(f"[lightning_pfd] {line}", flush=True)
        if self.resume_checkpoint is not None and self.subcommand == "fit":
            with warnings.catch_warnings():  # untrue here: see RESUMED_CSV_WARNING
                warnings.filterwarnings("ignore", message=RESUMED_CSV_WARNING)
                lines = continue_loggers(self.trainer, self.resume_checkpoint, self._logger_init_args())
            for line in lines:
                print(f"[lightning_pfd] {line}", flush=True)
        elif self.resume_checkpoint is not None:  # validate / test / predict: their own log version
            print(f"[lightning_pfd] {self.subcommand} logs to a new logger version (the logs of the "
                  f"run that wrote {self.resolved_ckpt_path} are not changed)", flush=True)

    def _logger_init_args(self) -> list:
        """The constructor arguments of each of ``trainer.loggers`` from the parsed config (in
        the trainer's order; None for a logger the config does not describe)."""
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        given = cfg.get("trainer.logger") if cfg is not None else None
        entries = given if isinstance(given, list) else [given]
        out = []
        for entry in entries:
            if entry is None or isinstance(entry, bool) or not hasattr(entry, "get"):
                continue
            kwargs = {}
            for part in ("init_args", "dict_kwargs"):
                value = entry.get(part)
                if value is not None:
                    kwargs.update(value.as_dict() if hasattr(value, "as_dict") else dict(value))
            out.append(kwargs if entry.get("class_path") else None)
        return out if len(out) == len(self.trainer.loggers) else [None] * len(self.trainer.loggers)

    def before_fit(self) -> None:
        self.validate_run()

    def before_validate(self) -> None:
        self.validate_run()

    def before_test(self) -> None:
        self.validate_run()

    # -- where did everything go ---------------------------------------------------------------
    def after_fit(self) -> None:
        trainer = self.trainer
        if trainer.global_rank != 0:
            return
        lines = ["", "[lightning_pfd] run finished."]
        for lg in trainer.loggers:
            name = type(lg).__name__
            d = getattr(lg, "log_dir", None) or getattr(lg, "save_dir", None)
            if not _logger_started(lg):
                continue  # this logger never started: its directory does not exist
            if "Wandb" in name:
                try:
                    d = lg.experiment.dir.rsplit("/files", 1)[0]
                except Exception:  # pragma: no cover - depends on wandb internals
                    pass
            lines.append(f"  logs ({name}): {d}")
        for ckpt in trainer.checkpoint_callbacks:
            parts = [f"{k}: {Path(v).name}" for k, v in
                     (("last", getattr(ckpt, "last_model_path", "")),
                      ("best", getattr(ckpt, "best_model_path", "") if ckpt.monitor else "")) if v]
            lines.append(f"  checkpoints: {ckpt.dirpath}" + (f" ({', '.join(parts)})" if parts else ""))
        from ..callbacks.regime import RegimeMonitor  # the report folders its monitors wrote

        plots = [d for cb in trainer.callbacks if isinstance(cb, RegimeMonitor) for d in cb.report_dirs]
        if plots:
            lines.append("  plots: " + ", ".join(sorted(set(map(str, plots)))))
        full = [lg.disk_full for lg in trainer.loggers if getattr(lg, "disk_full", None)]
        for step, d, _free in full:  # said at once during the run; the closing lines repeat it
            lines.append(f"  W&B run INCOMPLETE from step {step}: the disk of {d} filled; the CSV log has every row")
        gone = [_wandb_gone(lg) for lg in trainer.loggers if "Wandb" in type(lg).__name__]
        for step, d in filter(None, gone):
            lines.append(f"  W&B run LOST: its directory {d} was deleted during the run"
                         + (f" (found at step {step})" if step is not None else "")
                         + "; there is nothing to sync; the CSV log has every row")
        full = full or any(gone)
        if any("Wandb" in type(lg).__name__ for lg in trainer.loggers) and not full:
            if os.environ.get("WANDB_MODE") in ("offline", "dryrun"):  # Lightning's offline: dryrun
                lines.append("  W&B ran offline (no credentials): upload later with `wandb login`, then `wandb sync <run dir>`")
        print("\n".join(lines), flush=True)


# ----------------------------------------------------------------------------- the command line
def ensure_wandb_mode() -> str:
    """Switch W&B to offline mode when no credentials exist (unless WANDB_MODE is set)."""
    if "WANDB_MODE" not in os.environ and not has_wandb_credentials():
        os.environ["WANDB_MODE"] = "offline"
    return os.environ.get("WANDB_MODE", "online")


def resolve_config_path(value: str) -> str:
    """Accept a path, or the bare name of an embedded config (``quickstart`` / ``quickstart.yaml``)."""
    p = Path(value)
    if p.exists():
        return value
    for cand in (CONFIG_DIR / value, CONFIG_DIR / f"{value}.yaml"):
        if cand.exists():
            return str(cand)
    embedded = sorted(q.stem for q in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError("--config", "no such file, and not the name of an embedded config",
                      value=value, accepted=embedded)


def rewrite_configs(argv: list) -> list:
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = resolve_config_path(out[i + 1])
            check_unique_keys(out[i + 1])
        elif a.startswith("--config="):
            out[i] = "--config=" + resolve_config_path(a.split("=", 1)[1])
            check_unique_keys(out[i].split("=", 1)[1])
    return out


def needs_default_config(argv: list) -> bool:
    """A subcommand given without --config and without choosing model/data classes."""
    if argv[0] not in SUBCOMMANDS:
        return False
    rest = argv[1:]
    if any(a in ("-h", "--help") for a in rest):
        return False
    chosen = ("--config", "-c", "--model", "--data")
    return not any(a in chosen or a.startswith(tuple(c + "=" for c in chosen)) for a in rest)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def join_negative_values(argv: Sequence[str]) -> list:
    """``--key -1e-3`` → ``--key=-1e-3``: argparse takes a token that starts with '-' and is not a
    plain integer/decimal (``-1e-3``) for an option and fails with "expected one argument"."""
    out: list = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if a.startswith("--") and "=" not in a and nxt is not None and nxt.startswith("-") \
                and _is_number(nxt):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def disk_error(e: OSError, trainer, argv: list) -> int:
    """One block for a write that failed for lack of space: which file, what is intact, how to
    continue; exit status 1."""
    from .interrupts import _checkpoint_epoch, _last_checkpoint, _resume_command

    what = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "over the file-size limit "
            "(ulimit -f)"}.get(e.errno, "over the disk quota")
    lines = [f"{PROG}: error: cannot write {e.filename or 'a file'}: {what} ([Errno {e.errno}] {e.strerror})."]
    cache = _cache_line(e.filename)
    if cache:
        lines.append(cache)
    ckpt = _last_checkpoint(trainer) if trainer is not None else None
    if ckpt is not None:
        epoch = _checkpoint_epoch(ckpt)
        lines.append(f"  intact: {ckpt}" + (f" (end of epoch {epoch})" if epoch is not None else "")
                     + " and the config.yaml that goes with it (checkpoints are replaced atomically)")
        if argv and argv[0] == "fit":
            lines.append(f"  free space (or raise the limit), then resume: {_resume_command(argv, PROG)}")
    else:
        lines.append("  no checkpoint of this run was written; free space (or raise the limit) and run again")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return 1


def _wandb_gone(lg) -> Optional[tuple]:
    """(step, directory) of a W&B logger whose started run's directory was deleted during the
    run (seen by its logging, or now), else None."""
    gone = getattr(lg, "run_dir_gone", None)
    if gone:
        return gone
    run_dir = getattr(lg, "_run_dir", None)
    d = run_dir() if callable(run_dir) and getattr(lg, "_pfd_started", False) else None
    return (None, d) if d and not os.path.isdir(d) else None


def _cache_line(filename) -> Optional[str]:
    """For a failed write inside the cache directory: which setting places it."""
    from ..cache import _cache_root

    root, path, given = _cache_root()
    try:
        inside = filename is not None and Path(filename).resolve().is_relative_to(path.resolve())
    except (OSError, ValueError):
        inside = False
    if not inside:
        return None
    where = f"LIGHTNING_PFD_CACHE={root}" if given else f"the default cache {path} (LIGHTNING_PFD_CACHE unset)"
    return (f"  this file is in the cache ({where}): free space there, or point LIGHTNING_PFD_CACHE "
            "at a file system with room; cache entries are recomputed when missing")


def _logger_started(lg) -> bool:
    """Whether a logger wrote anything: W&B while its run is the process's active run (a
    finished run's directory exists too), file loggers when their log directory exists."""
    if "Wandb" in type(lg).__name__:
        import wandb

        return wandb.run is not None
    d = getattr(lg, "log_dir", None) or getattr(lg, "save_dir", None)
    return d is None or os.path.isdir(str(d))


def _launching_process() -> bool:
    """Not a DDP rank > 0 / another node (started by Lightning's launcher, torchrun or SLURM)."""
    return all(os.environ.get(v, "0") == "0" for v in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                                                       "SLURM_PROCID"))


def check_components(trainer, model, datamodule, configured=()) -> None:
    """The checks of :meth:`PFDLightningCLI.validate_run` that need no checkpoint and write
    nothing (model <-> data shape, the data, shared hyper-parameters, every callback's
    ``check_setup``), on objects built elsewhere: the sweep pre-flight runs them for every trial
    (:mod:`lightning_pfd.sweeps.validate`). ``configured``: ``(callback, config entry)`` for each
    callback built from a config (a refusal gets its path, see :func:`check_callbacks`). Cache
    writes are deferred by the caller."""
    probe = PFDLightningCLI.__new__(PFDLightningCLI)  # the checks only read these attributes
    probe.trainer, probe.model, probe.datamodule, probe.subcommand = trainer, model, datamodule, "fit"
    probe.configured_callbacks = list(configured)
    check_run_length(trainer)
    probe._check_shapes()
    probe._check_data()
    probe._check_shapes()
    probe._check_hparams_merge()
    probe._check_callbacks()
    check_monitored_keys(trainer)
    check_wandb_online(trainer)


class RunFinished(Exception):
    """``fit --ckpt_path`` of a run with nothing left to train (raised before any write)."""


#: the trainer of the command running in this process (the resume message of a stopped run)
RUNNING: dict = {}


def run_lightning_cli(argv: Sequence[str], overwrite: bool = False,
                      allow_data_change: bool = False, allow_optimizer_change: bool = False) -> PFDLightningCLI:
    """Run :class:`PFDLightningCLI` on ``argv`` (W&B offline without credentials). The package's
    modules and datamodules are imported first, so ``--help`` lists them as the known subclasses
    of ``--model`` / ``--data`` (jsonargparse lists the subclasses imported so far)."""
    from .. import data, modules  # noqa: F401 - registered as subclasses by being imported

    ensure_wandb_mode()
    saved = sys.argv
    sys.argv = [PROG] + list(argv)  # LightningCLI warns when both sys.argv and args are given
    try:
        return PFDLightningCLI(args=None, overwrite=overwrite, stop_when_finished=True,
                               allow_data_change=allow_data_change,
                               allow_optimizer_change=allow_optimizer_change)
    finally:
        sys.argv = saved
