"""RegimeMonitor: turns the per-epoch metric curves into events while training runs.

Hook order [choice]: the measurement callbacks log in ``on_validation_epoch_end`` and Lightning
calls the callbacks' hooks in list order *before* the LightningModule's own hook, so a monitor
reading there would miss what later callbacks or the module log. The monitor therefore reads
``trainer.callback_metrics`` in ``on_validation_end`` — after every ``on_validation_epoch_end``
— and can be placed anywhere in the callback list. ``self.log`` is not allowed there, so events
go to the loggers directly (``logger.log_metrics``, with ``epoch``) and into
``trainer.callback_metrics``.

Freshness [choice]: a watched key counts as measured in this validation when the measurement
callback that logs it measured at this pass (its
:meth:`~lightning_pfd.callbacks.base.MeasurementCallback.measured_now`, the one rule: its last
measurement at the trainer's epoch and step, in a pass its schedule measured) — so a
metric measured every k epochs is not recorded again with a stale value. The value recorded is the *logged* one (``trainer.callback_metrics``: what
metrics.csv / W&B hold and ``report`` reads, a float32 for a Python number). A key that no
measurement callback logs (``self.log`` of the LightningModule, or a callback of another kind)
is recorded at every validation in which it is in ``trainer.callback_metrics``: Lightning keeps
no public record of *when* a value was logged (``callback_metrics`` / ``logged_metrics`` hold
the last value of the whole fit), so such a key must be logged at every validation
(``validation_step`` / ``on_validation_epoch_end``); a curve measured less often comes from a
``MeasurementCallback`` (``log_metrics`` keeps the row that says when).

Per-unit records travel in memory: at each validation the monitor keeps the records made at
this epoch and step (:func:`~lightning_pfd.callbacks.base.fresh_units`: the very records every
``MeasurementCallback`` writes to ``per_unit/``) in a
:class:`~lightning_pfd.analysis.per_unit.UnitMemory`, whose
series and problem lines equal :func:`~lightning_pfd.analysis.per_unit.load_units` on the run's
files. The files (``<default_root_dir>/per_unit``) are read once after a resume (the records
written before it; any run that is not a fresh fit) and by the end-of-fit analysis, which is
``report``'s: it reads the files as ``report`` does, so the final events, the report and
``report`` on the run's files agree by construction, damaged files included.

Per validation (skipped during the sanity check) it appends one row {epoch, step, metrics} to its
history (kept in ``state_dict`` for resume), runs
:func:`lightning_pfd.analysis.events.analyze_history` on it and emits every *new* event once:
``events/<name>_epoch`` and ``events/<name>_significance`` as metrics (plus
``events/memorization_lead_epochs`` when the ICR minimum precedes the onset), a W&B table
``events`` when a ``WandbLogger`` is attached, and a console line. At the end of fit it classifies
the regime (``events/regime_code``: 0 generalization, 1 transition, 2 memorization; W&B summary
``events/regime``), writes the report (PNG figures + markdown, as ``python -m lightning_pfd
report``) and logs the figures (W&B, TensorBoard: :func:`~lightning_pfd.callbacks.figures.log_figure`)
as ``plots/dynamics`` and ``plots/icr_memorization``.

The curves it reads are those of the roles (``keys``) plus every key without a role that lists
event detectors (a user metric) among the keys the trainer's callbacks declare
(:func:`lightning_pfd.keys.collect`, at setup; saved with the detector settings so that
``report`` reads them back): their events are named ``<key slug>_<detector>`` (:func:`lightning_pfd.analysis.events.detect_registered`).

Online events are **provisional**: they use the history so far (an E_gen rise that a later second
descent turns into double descent is first announced as early learning) and say so on the console
and in the W&B table (``status`` column). At the end of fit every event is re-tested by the same
analysis ``report`` runs, on the same inputs (the logged curves and the per-unit files in
``<default_root_dir>/per_unit``): each provisional event is **confirmed**
(``events/<name>_confirmed`` = 1, with its significance) when the final event is at the same
epoch, **moved** (``events/<name>_moved`` = 1 and the final epoch) when the final test puts it at
another epoch, **undecided** (``events/<name>_undecided`` = 1) when the final noise model fails
its check, or **retracted** (``events/<name>_retracted`` = 1); each with a console line. Events
found only at the end are logged then.
The report and ``events.json`` hold the final answer, which ``python -m lightning_pfd report`` on
the run's files reproduces. :attr:`RegimeMonitor.report_dirs` lists the folders a report was
written to (the command line prints them at the end of ``fit``).

Settings saved with the run: at the start of fit the monitor writes its detector settings (keys,
window, min_sigma, min_rel, confirm, require_descent) atomically to ``detector_settings.json`` in
its report directory and, when it is the only RegimeMonitor of the trainer, in the run directory
of every logger (W&B offline-run dir, CSVLogger/TensorBoard version dir); ``python -m
lightning_pfd report`` reads them back so a later report repeats the run's analysis.

Several monitors: :attr:`RegimeMonitor.state_key` is built from ``keys`` and ``report_dir``, so
two monitors in one trainer keep separate states in a checkpoint; they must have different
``report_dir`` values (checked at setup), since they would otherwise overwrite each other's
report. A checkpoint written before the state key existed (state under "RegimeMonitor") is still
restored.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from .. import keys as keys_registry
from ..analysis.events import (DEFAULT_KEYS, DIVERGED_KEYS, MIN_SIGMA, Event, RunAnalysis, analyze_history,
                               describe_transient, format_epoch)
from ..analysis.history import History
from ..analysis.per_unit import UnitMemory, load_units
from ..analysis.report import check_settings, save_detector_settings
from ..errors import ConfigError
from ..validation import NonNegativeInt, check_args
from .base import MeasurementCallback, fresh_units, per_unit_store, prepare_per_unit_store
from .figures import log_figure, log_to_loggers
from .state import callback_state_key

__all__ = ["RegimeMonitor"]

EVENT_COLUMNS = ["event", "status", "epoch", "significance", "detected_epoch", "description"]


def _local_log_dir(trainer):
    """``trainer.log_dir`` without its broadcast: this monitor writes on rank 0 only, and a
    collective call made by one rank alone hangs a DDP run."""
    if not trainer.loggers:
        return None
    lg = trainer.loggers[0]
    return getattr(lg, "log_dir", None) or getattr(lg, "save_dir", None)


class RegimeMonitor(Callback):
    """Detect early learning, double descent, ICR minimum and memorization onset online; regime
    and report at the end of fit.

    Args:
        keys: the event roles: role -> the logged metric that plays it, overriding
            :data:`~lightning_pfd.analysis.events.DEFAULT_KEYS` role by role. The roles and what
            reads them: ``e_gen`` (default ``pfd/e_gen``): early learning, double descent and the
            regime; ``e_mem`` (``pfd/e_mem``): the regime and, without a ratio, the memorization
            onset; ``mem_ratio`` (``mem/ratio``): the memorization onset and the regime; ``icr``
            (``icr/icr``): the ICR minimum and the onset's lead; ``gap`` (``loss/gap``), or
            ``loss_test`` − ``loss_train`` (``loss/test_fixed``, ``loss/train_fixed``) without
            it: the loss gap in the regime's detail (it does not vote). E.g.
            ``{"e_gen": "sw/e_gen"}`` runs early learning and double descent on a user metric.
            The monitor records these curves (and their ``_se``); the assignment is saved with
            the detector settings, so ``report`` reads the same curves.
        window, min_sigma, min_rel, confirm: detector parameters (docs/events.md): ``min_sigma``
            is the z every leg of an event must reach on the held-out seeds (calibrated
            default), ``min_rel`` an optional effect-size floor (fraction of the curve).
        write_report: write the report at the end of fit.
        report_dir: where; default ``<W&B run dir>/report``, else ``<trainer.log_dir>/report``,
            else ``<default_root_dir>/report``. It also receives ``detector_settings.json``
            at the start of fit; several monitors in one trainer need different report_dirs.
        plot_every_n_epochs: also log the figures to W&B every n validations (0 = only at the end).
        require_descent: False also reports early learning when E_gen is lowest at the first
            evaluation (the descent happened before it; see ``detect_early_learning``).
        verbose: print a console line per event.
        detector_modules: modules to import (now) whose import registers event detectors of
            your own (:func:`lightning_pfd.analysis.register_detector`); a metric key names
            them in its ``detectors``. Saved with the detector settings, so ``report`` can name
            them (it imports them only when given ``--detector-modules``).
    """

    def __init__(self, keys: Optional[dict] = None, window: int = 5, min_sigma: float = MIN_SIGMA,
                 min_rel: float = 0.0, confirm: int = 3, write_report: bool = True,
                 report_dir: Optional[str] = None, plot_every_n_epochs: NonNegativeInt = 0,
                 require_descent: bool = True, verbose: bool = True,
                 detector_modules: Sequence[str] = ()) -> None:
        check_settings(dict(keys=dict(keys or {}), window=window, min_sigma=min_sigma,
                            min_rel=min_rel, confirm=confirm))
        check_args(RegimeMonitor.__init__, locals())
        from ..analysis.detectors import import_detector_modules

        self.detector_modules = import_detector_modules(detector_modules)
        self.keys = dict(DEFAULT_KEYS, **(keys or {}))
        self.metric_keys_seen = keys_registry.BUILTIN  # the trainer's keys, collected at setup
        self.params = dict(window=window, min_sigma=min_sigma, min_rel=min_rel, confirm=confirm)
        self.require_descent = bool(require_descent)
        self.write_report = write_report
        self.report_dir = report_dir
        self.plot_every_n_epochs = plot_every_n_epochs
        self.verbose = verbose
        self.history: list = []
        self.emitted: dict = {}
        self.regime: Optional[dict] = None
        self.final: dict = {}
        #: the final analysis's transients (spikes named as such, never events)
        self.transients: list = []
        self.report_paths: Optional[dict] = None
        #: the folders this monitor wrote its report to in this fit (listed by the command line)
        self.report_dirs: list = []
        self._unit_problems: list = []
        self._memory: Optional[UnitMemory] = None  # this run's per-unit records, in memory
        self._store_root = None

    # ------------------------------------------------------------------ state
    @property
    def state_key(self) -> str:
        """Checkpoint key: the class name with ``keys`` and ``report_dir``, so several monitors
        in one trainer save and restore their own state."""
        return callback_state_key(self, keys=self.keys, report_dir=self.report_dir)

    @property
    def detector_settings(self) -> dict:
        """keys, window, min_sigma, min_rel, confirm, require_descent (saved with the run)."""
        return dict(keys=dict(self.keys), **self.params, require_descent=self.require_descent)

    def state_dict(self) -> dict:
        return {"history": [dict(r) for r in self.history], "emitted": dict(self.emitted),
                "regime": self.regime, "final": dict(self.final)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [dict(r) for r in state_dict.get("history", [])]
        self.emitted = dict(state_dict.get("emitted", {}))
        self.regime = state_dict.get("regime")
        self.final = dict(state_dict.get("final", {}))

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Collect the run's metric keys (:func:`lightning_pfd.keys.collect`); refuse two
        RegimeMonitors with one report directory (they would overwrite each other's report and
        settings)."""
        self.metric_keys_seen = keys_registry.collect(trainer.callbacks)
        if stage == "fit":  # a new fit: its records are read (resume) or kept anew
            self._memory = None
            self.report_dirs = []

        def where(cb):
            return str(Path(cb.report_dir).resolve()) if cb.report_dir else None

        same = [cb for cb in trainer.callbacks if isinstance(cb, RegimeMonitor)
                and where(cb) == where(self)]
        if len(same) > 1:
            raise ConfigError("report_dir",
                              "several RegimeMonitors share one report directory; their reports "
                              "and saved settings would overwrite each other",
                              value=self.report_dir,
                              suggestion="give each RegimeMonitor its own report_dir")

    def on_fit_start(self, trainer, pl_module) -> None:
        """Save the detector settings with the run before training (a crashed run keeps them)."""
        if trainer.is_global_zero:
            self._save_settings(trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        """A fresh fit moves an earlier run's per-unit records aside before this monitor can read
        them (:func:`~lightning_pfd.callbacks.base.prepare_per_unit_store`)."""
        self._store_root = prepare_per_unit_store(trainer).root

    def _save_settings(self, trainer) -> list:
        """``detector_settings.json`` in the report dir (when a report will be written) and,
        for the only monitor, in every logger's run dir; returns the paths written."""
        report = self._default_dir(trainer)
        dirs = [report] if self.write_report else []
        if sum(isinstance(cb, RegimeMonitor) for cb in trainer.callbacks) == 1:
            dirs += [d for d in self._logger_dirs(trainer) if d != report]
        meta = dict(written_by=f"{type(self).__module__}.{type(self).__qualname__}",
                    state_key=self.state_key, report_dir=str(report))
        declared = [dataclasses.asdict(k) for k in self.metric_keys_seen.all_keys(kind=None)
                    if k.key not in keys_registry.BUILTIN]
        if declared:  # read back by `report` (analysis.report.saved_metric_keys)
            meta["metric_keys"] = declared
        if self.detector_modules:  # named (never imported) by `report`
            meta["detector_modules"] = list(self.detector_modules)
        return [save_detector_settings(d, self.detector_settings, **meta)
                for d in dict.fromkeys(dirs)]

    @staticmethod
    def _logger_dirs(trainer) -> list:
        """Run directory of each logger: W&B offline-run dir, else the logger's log_dir."""
        out = []
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                d = getattr(lg.experiment, "dir", None)  # .../offline-run-*/files
                d = Path(d).parent if isinstance(d, str) and d else None
            else:
                d = getattr(lg, "log_dir", None)
                d = Path(d) if isinstance(d, str) and d else None
            if d is not None:
                out.append(d)
        return out

    # ------------------------------------------------------------------ reading
    def watched(self) -> list:
        """The metric names recorded: the curve of every role, plus every key without a role
        that lists event detectors (of the keys the trainer's callbacks declare, collected at
        setup: :func:`lightning_pfd.keys.collect`)."""
        user = [k.key for k in self.metric_keys_seen.all_keys() if k.role is None and k.detectors]
        se = [f"{k}_se" for k in self.keys.values()]  # error bands of the report's figures
        return list(dict.fromkeys(list(self.keys.values()) + user + se + list(DIVERGED_KEYS)))

    def series(self) -> dict:
        """{metric name: (epochs, values)} of the recorded history."""
        return History(rows=self.history).series_dict(self.watched())

    def units(self, final: bool = False) -> dict:
        """{metric: UnitSeries} of the watched metrics: the records kept in memory during the
        fit; ``final``: read from the run's per-unit files, as ``report`` reads them (module
        docstring). A damaged or unpaired record leaves its metric out, with a warning."""
        if final:
            units, problems = load_units(self._store_root, self.watched())
        elif self._memory is not None:
            units, problems = self._memory.series(self.watched())
        else:
            units, problems = {}, []
        for p in problems:
            if p not in self._unit_problems:
                self._unit_problems.append(p)
                rank_zero_warn(f"RegimeMonitor: {p}; that metric's events use its logged curve alone")
        return units

    def analyze(self, final: bool = False) -> RunAnalysis:
        return self._analyze(self.units(final=final), final)

    def _analyze(self, units: dict, final: bool) -> RunAnalysis:
        return analyze_history(self.series(), keys=self.keys, final=final, units=units,
                               require_descent=self.require_descent,
                               metric_keys=self.metric_keys_seen, **self.params)

    @staticmethod
    def _measured(trainer) -> tuple:
        """``(fresh, produced)``: the keys the trainer's measurement callbacks measured at this
        pass (:meth:`~lightning_pfd.callbacks.base.MeasurementCallback.measured_now`) and every
        key they log (module docstring)."""
        from .monitor import EvaluationMonitor

        fresh, produced = set(), set()
        for cb in trainer.callbacks:
            if not isinstance(cb, MeasurementCallback):
                continue
            keys = set(cb.metric_names())
            for row in cb.history:
                keys.update(row)
            if isinstance(cb, EvaluationMonitor) and cb.latest is not None:
                keys.update(cb.latest.values)
            keys.discard("epoch"), keys.discard("step")
            produced |= keys
            if cb.measured_now(trainer):
                fresh |= keys
        return fresh, produced

    def _unit_memory(self, trainer) -> UnitMemory:
        """This run's records in memory; created at the first validation of a run: empty for a
        fresh fit (its store was just started), else seeded once from the files (a resume: the
        records written before it)."""
        root = per_unit_store(trainer).root
        if self._memory is None or self._memory.root != root:
            self._memory = UnitMemory(root)
            fresh = trainer.state.fn == TrainerFn.FITTING and trainer.ckpt_path is None
            if not fresh:
                self._memory.load()  # its problem lines come with the series (units())
        self._store_root = root
        return self._memory

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        fresh, produced = self._measured(trainer)
        memory = self._unit_memory(trainer)
        for rec in fresh_units(trainer).values():
            memory.add(rec)
        cm = trainer.callback_metrics
        row = {"epoch": float(trainer.current_epoch), "step": float(trainer.global_step)}
        for name in self.watched():
            v = cm.get(name)
            if v is None or (name in produced and name not in fresh):
                continue  # not measured in this validation (absent, or its monitor's value is stale)
            row[name] = float(v.detach().double().cpu()) if torch.is_tensor(v) else float(v)
        if self.history and self.history[-1].get("step") == row["step"]:
            self.history[-1].update(row)
        else:
            self.history.append(row)
        analysis = self.analyze(final=False)
        new = [e for e in analysis.events if e.name not in self.emitted]  # each event once
        for e in new:
            self.emitted[e.name] = dict(e.to_dict(), status="provisional",
                                        announced_epoch=int(trainer.current_epoch))
        if new:
            self._emit(trainer, new)
        self._emit_lead(trainer)
        n = self.plot_every_n_epochs
        if n and trainer.is_global_zero and (trainer.current_epoch + 1) % n == 0:
            self._log_figures(trainer, analysis, self._default_dir(trainer) / "latest")

    # ------------------------------------------------------------------ output
    def _emit(self, trainer, events: list) -> None:
        metrics = {}
        for e in events:
            metrics[f"events/{e.name}_epoch"] = float(e.epoch)
            metrics[f"events/{e.name}_significance"] = float(min(e.significance, 1e30))
        log_to_loggers(trainer, metrics)
        if trainer.is_global_zero:
            self._log_table(trainer)
            if self.verbose:
                for e in events:
                    self._print(trainer, f"[bold magenta]event (provisional)[/] epoch "
                                         f"{trainer.current_epoch}: {e.describe()}")

    def _emit_lead(self, trainer) -> None:
        """Once both are known (in either order): lead = onset epoch − ICR-minimum epoch."""
        on, icr = self.emitted.get("memorization_onset"), self.emitted.get("icr_minimum")
        if on is None or icr is None or "memorization_lead" in self.emitted:
            return
        lead = float(on["epoch"]) - float(icr["epoch"])
        self.emitted["memorization_lead"] = {"lead_epochs": lead}
        log_to_loggers(trainer, {"events/memorization_lead_epochs": lead})
        if trainer.is_global_zero and self.verbose:
            self._print(trainer, f"[bold magenta]event[/] ICR minimum (epoch {icr['epoch']}) "
                                 f"{'anticipates' if lead >= 0 else 'follows'} memorization onset "
                                 f"(epoch {on['epoch']}) by {abs(lead):g} epochs")

    @staticmethod
    def _event(d: dict) -> Event:
        return Event(**{k: d[k] for k in ("name", "epoch", "significance", "detected_epoch", "detail")},
                     status="undecided" if d.get("status") == "undecided" else "confirmed")

    def _table_rows(self) -> list:
        rows = []
        names = list(dict.fromkeys([*self.emitted, *self.final]))
        for name in names:
            if name == "memorization_lead":
                continue
            d = self.final.get(name) or self.emitted[name]
            e = self._event(d)
            status = d.get("status", "provisional")
            rows.append([e.name, status, float(e.epoch), float(min(e.significance, 1e30)),
                         float(e.detected_epoch), e.describe()])
        for t in getattr(self, "transients", []):
            rows.append(["transient", "not an event", float(t["epoch"]), float("nan"), float(t["epoch"]),
                         describe_transient(t)])
        if self.regime is not None:
            rows.append(["regime", "final", float("nan"), float("nan"), float("nan"),
                         f"{self.regime['name']}: " + "; ".join(self.regime["reasons"])])
        return rows

    def _settle(self, trainer, analysis: RunAnalysis) -> None:
        """Re-test every provisional event with the final analysis (the same code and inputs as
        ``report``): ``events/<name>_confirmed`` = 1 with the final significance when the final
        event is at the provisional epoch; ``events/<name>_moved`` = 1 (and the final epoch) when
        the final test puts it elsewhere; ``events/<name>_undecided`` = 1 when the final noise
        model fails its checks; ``events/<name>_retracted`` = 1 when it is gone. An event found
        only at the end is logged as new; an undecided one found only at the end as undecided."""
        final = {e.name: e for e in analysis.events}
        undecided = {e.name: e for e in analysis.undecided}
        metrics, lines = {}, []
        for name, d in self.emitted.items():
            if name == "memorization_lead":
                continue
            e = final.get(name)
            if e is None and name in undecided:
                u = undecided[name]
                self.final[name] = dict(u.to_dict(), status="undecided", provisional_epoch=d["epoch"])
                metrics[f"events/{name}_undecided"] = 1.0
                lines.append(f"[bold yellow]undecided[/] {u.describe()} — the provisional event "
                             f"(epoch {d['epoch']}) is not confirmed")
            elif e is None:
                self.final[name] = dict(d, status="retracted")
                metrics[f"events/{name}_retracted"] = 1.0
                lines.append(f"[bold yellow]retracted[/] {self._event(d).describe()} — not confirmed "
                             "by the final test on the whole run")
            elif float(e.epoch) != float(d["epoch"]):
                self.final[name] = dict(e.to_dict(), status="moved", provisional_epoch=d["epoch"])
                metrics.update({f"events/{name}_moved": 1.0, f"events/{name}_epoch": float(e.epoch),
                                f"events/{name}_significance": float(e.significance)})
                lines.append(f"[bold yellow]moved[/] the provisional event at epoch {d['epoch']} is at "
                             f"epoch {format_epoch(e.epoch)} in the final test: {e.describe()}")
            else:
                self.final[name] = dict(e.to_dict(), status="confirmed")
                metrics.update({f"events/{name}_confirmed": 1.0, f"events/{name}_epoch": float(e.epoch),
                                f"events/{name}_significance": float(min(e.significance, 1e30))})
                lines.append(f"[bold magenta]confirmed[/] {e.describe()}")
        for name, e in final.items():
            if name not in self.emitted:
                self.final[name] = dict(e.to_dict(), status="found at the end")
                metrics.update({f"events/{name}_confirmed": 1.0, f"events/{name}_epoch": float(e.epoch),
                                f"events/{name}_significance": float(min(e.significance, 1e30))})
                lines.append(f"[bold magenta]event (final)[/] {e.describe()}")
        for name, u in undecided.items():
            if name not in self.emitted:
                self.final[name] = dict(u.to_dict(), status="undecided")
                metrics[f"events/{name}_undecided"] = 1.0
                lines.append(f"[bold yellow]undecided[/] {u.describe()}")
        self.transients = list(getattr(analysis, "transients", []) or [])
        if self.transients:  # named as what they are, never as an event
            metrics["events/transients"] = float(len(self.transients))
            for t in self.transients:
                lines.append(f"[bold cyan]transient[/] at epoch {format_epoch(t['epoch'])}: "
                             + describe_transient(t))
        on, icr = final.get("memorization_onset"), final.get("icr_minimum")
        if on is not None and icr is not None:  # the lead of the final events
            lead = float(on.epoch) - float(icr.epoch)
            if self.emitted.get("memorization_lead", {}).get("lead_epochs") != lead:
                metrics["events/memorization_lead_epochs"] = lead
        if metrics:
            log_to_loggers(trainer, metrics)
        if trainer.is_global_zero and self.verbose:
            for line in lines:
                self._print(trainer, line)

    def _log_table(self, trainer) -> None:
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.log_table(key="events", columns=EVENT_COLUMNS, data=self._table_rows(),
                             step=trainer.global_step)

    def _print(self, trainer, text: str) -> None:
        from lightning.pytorch.callbacks import RichProgressBar
        from rich import get_console
        from rich.console import Console

        # a rich progress bar draws on rich's global console: print through it (above the bar)
        bar = getattr(trainer, "progress_bar_callback", None)
        console = get_console() if isinstance(bar, RichProgressBar) else Console()
        console.print(text)

    def _default_dir(self, trainer) -> Path:
        if self.report_dir:
            return Path(self.report_dir)
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                run_dir = getattr(lg.experiment, "dir", None)  # .../offline-run-*/files
                if isinstance(run_dir, str) and run_dir:
                    return Path(run_dir).parent / "report"
        log_dir = _local_log_dir(trainer)
        if log_dir:
            return Path(log_dir) / "report"
        return Path(trainer.default_root_dir) / "report"

    def _log_figures(self, trainer, analysis: RunAnalysis, out_dir: Path) -> list:
        from ..analysis.plots import plot_dynamics, plot_icr_memorization

        series = self.series()
        figs = {"plots/dynamics": plot_dynamics(series, analysis.events, out_dir / "dynamics.png",
                                                keys=self.keys, window=self.params["window"]),
                "plots/icr_memorization": plot_icr_memorization(
                    series, analysis.events, out_dir / "icr_memorization.png", keys=self.keys,
                    window=self.params["window"])}
        figs = {k: v for k, v in figs.items() if v is not None}
        self._log_images(trainer, figs)
        return list(figs.values())

    @staticmethod
    def _log_images(trainer, figs: dict) -> None:
        """The written PNGs to the image loggers (W&B, TensorBoard); they stay on disk."""
        for key, path in figs.items():
            log_figure(trainer, key, path)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._store_root = per_unit_store(trainer).root
        at = getattr(pl_module, "diverged_at", None)
        if at and not any(DIVERGED_KEYS[0] in r for r in self.history):  # (diverged after the last validation)
            from ..modules.base import DIVERGENCE_CAUSES

            cause = DIVERGENCE_CAUSES.index(getattr(pl_module, "_bad_cause", "nonfinite")) + 1
            self.history.append({"epoch": float(at["epoch"]), "step": float(at["step"]),
                                 DIVERGED_KEYS[0]: float(at["epoch"]), DIVERGED_KEYS[1]: float(at["step"]),
                                 DIVERGED_KEYS[2]: float(cause)})
        units = self.units(final=True)  # the run's files, as `report` reads them
        analysis = self._analyze(units, final=True)
        self._settle(trainer, analysis)
        if analysis.regime is not None:
            self.regime = analysis.regime.to_dict()
            log_to_loggers(trainer, {"events/regime_code": float(analysis.regime.code)})
        if not trainer.is_global_zero:
            return
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                if self.regime is not None:
                    lg.experiment.summary["events/regime"] = self.regime["name"]
            elif hasattr(lg, "save"):
                lg.save()
        self._log_table(trainer)
        if self.regime is not None:
            if self.verbose:
                self._print(trainer, f"[bold magenta]regime[/]: {self.regime['name']} "
                                     f"({'; '.join(self.regime['reasons'])})")
        if self.write_report and self.history:
            from ..analysis.report import write_report

            out = self._default_dir(trainer)
            self.report_paths = write_report(
                self.series(), out, analysis=analysis, **self.detector_settings,
                unit_problems=self._unit_problems, unit_keys=sorted(units),
                metric_keys=self.metric_keys_seen,
                settings_sources=dict.fromkeys(self.detector_settings, "RegimeMonitor arguments"))
            figs = {f"plots/{Path(p).stem}": p for p in self.report_paths["figures"]}
            self.report_dirs.append(str(out))
            self._log_images(trainer, figs)
            if self.verbose:
                self._print(trainer, f"[bold magenta]report[/]: {self.report_paths['markdown']}")
