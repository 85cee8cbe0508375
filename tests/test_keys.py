"""The metric keys (lightning_pfd/keys.py) and their consumers.

A key declared once (by a callback's ``metric_keys()`` or a metric's class) reaches the W&B setup
(define_metric: epoch axis, summary), the progress bar, the event analysis (its detectors run on
its curve; oracle: the detector called directly) and the report's metric table (oracle: numpy
min/max of the curve). Key sets are immutable: nothing here changes process state.
"""
import json

import numpy as np
import pytest
from lightning.pytorch import Callback

from lightning_pfd import keys
from lightning_pfd.analysis import events
from lightning_pfd.errors import ConfigError

T = np.arange(20, dtype=np.float64)
#: early learning: an interior minimum near epoch 5, then a sustained rise
U_CURVE = 2.0 + 2.0 * np.exp(-T / 2.0) + 1.0 * (1.0 - np.exp(-T / 12.0))
# with a little noise: a noiseless curve's events are undecided (its only "noise" is smooth)
U_CURVE = U_CURVE + 0.003 * np.random.default_rng(0).standard_normal(T.size)
PARAMS = dict(window=3, min_sigma=2.5, min_rel=0.0, confirm=2)


def _user(**kw):
    args = dict(display="SW_gen", lower_is_better=True, detectors=("early_learning",),
                progress_bar=True)
    args.update(kw)
    return keys.MetricKey("sw/e_gen", **args)


# ----------------------------------------------------------------------------- registry
def test_builtin_roles_are_the_event_keys():
    assert events.DEFAULT_KEYS == keys.roles()
    assert set(keys.roles()) == set(keys.ROLES)  # every role has its key
    assert keys.get("pfd/e_gen").display == "E_gen"
    assert keys.get("mem/ratio").wandb_summary == "max,last"
    assert keys.get("pfd/e_gen").wandb_summary == "min,last"  # from lower_is_better
    assert keys.get("icr/n").wandb_summary is None  # no direction: W&B default
    assert keys.progress_bar_keys() == {
        "E_gen": "pfd/e_gen", "E_mem": "pfd/e_mem", "ICR": "icr/icr", "mem": "mem/ratio"}
    assert "pfd/samples" not in [k.key for k in keys.all_keys()]  # an image, not a curve
    assert keys.find("pfd/samples").kind == "image"


def test_identical_declarations_are_one_key_and_conflicts_are_errors():
    ks = keys.BUILTIN.with_keys(_user(), _user())  # the same definition twice: one key
    assert ks.get("sw/e_gen") == _user() and len(ks) == len(keys.BUILTIN) + 1
    with pytest.raises(ConfigError, match="different definition") as err:
        ks.with_keys(_user(display="other"))
    assert "sw/e_gen" in err.value.field and "display" in str(err.value)
    assert ks.get("sw/e_gen").display == "SW_gen"  # unchanged
    assert keys.find("sw/e_gen") is None and "sw/e_gen" not in keys.BUILTIN  # BUILTIN untouched


def test_a_role_belongs_to_one_key():
    with pytest.raises(ConfigError, match="already belongs to 'pfd/e_gen'"):
        keys.BUILTIN.with_keys(keys.MetricKey("other/e_gen", role="e_gen"))
    with pytest.raises(ConfigError, match="different definition"):
        keys.BUILTIN.with_keys(keys.MetricKey("new/a"), keys.MetricKey("pfd/e_gen"))


def test_key_sets_are_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        keys.BUILTIN._keys = {}
    with pytest.raises(TypeError):
        keys.BUILTIN._keys["x/y"] = keys.MetricKey("x/y")  # a read-only mapping
    assert "x/y" not in keys.BUILTIN


class _Declares(Callback):
    """A callback that logs nothing itself and declares ``declared``."""

    def __init__(self, *declared):
        self.declared = declared

    def metric_keys(self):
        return list(self.declared)


def test_collect_adds_what_callbacks_declare_and_refuses_clashes():
    ks = keys.collect([_Declares(_user()), object(), _Declares()])  # object(): declares nothing
    assert ks.get("sw/e_gen") == _user() and ks.all_keys()[:len(keys.BUILTIN.all_keys())] == keys.all_keys()
    with pytest.raises(ConfigError, match="different definition"):
        keys.collect([_Declares(_user()), _Declares(_user(display="other"))])


def test_monitors_declare_their_namespaces():
    from lightning_pfd.callbacks import ICRMonitor, MemorizationMonitor

    icr, mem = ICRMonitor(name="icr_hi", sigmas=[1.0]), MemorizationMonitor(name="mem2")
    ks = keys.collect([icr, mem, ICRMonitor(num_images=8)])
    assert ks.get("icr_hi/icr") == keys.get("icr/icr").renamed("icr_hi/icr")
    assert ks.get("mem2/ratio").wandb_summary == "max,last" and ks.get("mem2/ratio").role is None
    assert [k.key for k in ICRMonitor().metric_keys()] == []  # the default namespace: built-in
    assert "icr_hi/icr" not in keys.BUILTIN


class _Sliced:
    """Sliced distance between two flows."""

    higher_is_better = False
    display_name = "SW"
    detectors = ("early_learning",)
    progress_bar = True


def test_a_metric_class_is_the_one_declaration_of_its_key():
    import functools

    k = keys.MetricKey.from_metric("sw/e_gen", functools.partial(_Sliced))
    assert (k.display, k.lower_is_better, k.detectors, k.progress_bar) == ("SW", True, ("early_learning",), True)
    assert k.description == "Sliced distance between two flows." and k.wandb_summary == "min,last"
    plain = keys.MetricKey.from_metric("u/x", lambda: None)  # nothing declared: a plain key
    assert (plain.display, plain.lower_is_better, plain.detectors) == ("u/x", None, ())


def test_builtin_directions_are_declared_once():
    """torchmetrics' ``higher_is_better`` of the shipped metrics is read from the key table (the
    one declaration, readable without torch): no metric class states a direction of its own
    literally, and the classes agree with the table (E_mem has no direction: it depends on the
    regime)."""
    import ast
    from pathlib import Path

    from lightning_pfd.metrics import (InvariantContaminationRatio, LogAbsoluteDensityRatio, MemorizationRatio,
                                       ProbabilityFlowDistance, RootMeanSquaredQuantileError)

    for key, cls in [("pfd/e_gen", ProbabilityFlowDistance), ("icr/icr", InvariantContaminationRatio),
                     ("mem/ratio", MemorizationRatio), ("tail/rmsqe", RootMeanSquaredQuantileError),
                     ("tail/loader", LogAbsoluteDensityRatio)]:
        assert keys.get(key).lower_is_better is (not cls.higher_is_better), key
        source = Path(__import__(cls.__module__, fromlist=["_"]).__file__).read_text()
        (node,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        literal = [a for a in node.body if isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant)
                   and any(getattr(t, "id", None) == "higher_is_better" for t in a.targets)]
        assert not literal, f"{cls.__name__} states higher_is_better literally"


@pytest.mark.parametrize("kwargs, field", [
    (dict(key="bad key"), "keys.key"),
    (dict(key=""), "keys.key"),
    (dict(key="a//b"), "keys.key"),
    (dict(key="x/y", detectors=("early_lerning",)), "detectors"),
    (dict(key="x/y", role="egen"), "role"),
    (dict(key="x/y", summary="minimum"), "summary"),
    (dict(key="x/y", lower_is_better="yes"), "lower_is_better"),
    (dict(key="x/y", kind="movie"), "kind"),
])
def test_bad_definitions_are_rejected(kwargs, field):
    with pytest.raises(ConfigError) as err:
        keys.MetricKey(**kwargs)
    assert field in err.value.field


def test_unknown_key_suggests_a_close_name():
    with pytest.raises(ConfigError, match="did you mean 'pfd/e_gen'"):
        keys.get("pfd/egen")


def test_renamed_keeps_meaning_not_role():
    k = keys.get("pfd/e_gen").renamed("pfd_teacher2/e_gen")
    assert k.role is None and k.group == "pfd_teacher2" and k.lower_is_better is True
    assert k.detectors == keys.get("pfd/e_gen").detectors


# ----------------------------------------------------------------------------- consumers
class _Run:
    """Records define_metric calls (the W&B run API used by setup_wandb_metrics)."""

    def __init__(self):
        self.calls = {}

    def define_metric(self, name, step_metric=None, summary=None):
        self.calls[name] = (step_metric, summary)


def test_wandb_setup_reads_the_key_set():
    from lightning_pfd.callbacks.wandb_setup import setup_wandb_metrics

    run = _Run()
    setup_wandb_metrics(run, metric_keys=keys.BUILTIN.with_keys(_user()))
    assert run.calls["sw/e_gen"] == ("epoch", "min,last")
    assert run.calls["sw/*"] == ("epoch", None)  # its family on the epoch axis
    assert run.calls["pfd/e_gen"] == ("epoch", "min,last")
    assert run.calls["mem/ratio"] == ("epoch", "max,last")
    assert run.calls["icr/icr"] == ("epoch", "min,last")
    after = _Run()
    setup_wandb_metrics(after)
    assert "sw/e_gen" not in after.calls


def test_progress_bar_shows_a_declared_user_key(tmp_path):
    import warnings

    import lightning.pytorch as pl

    from lightning_pfd.callbacks.progress import PFDProgressBar, format_pfd_metrics
    from test_callback_base import Tiny  # a linear LightningModule

    bar = PFDProgressBar()
    m = {"pfd/e_gen": 2.5, "sw/e_gen": 0.123456}
    assert "SW_gen" not in bar.show and format_pfd_metrics(m) == {"E_gen": "2.5"}
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[bar, _Declares(_user())],
                         accelerator="cpu", enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_train_batches=1, limit_val_batches=1,
                         default_root_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny())
    assert bar.show["SW_gen"] == "sw/e_gen"  # collected from the trainer's callbacks at setup
    assert format_pfd_metrics(m, bar.show) == {"E_gen": "2.5", "SW_gen": "0.1235"}
    assert PFDProgressBar(show={"x": "pfd/e_gen"}).show == {"x": "pfd/e_gen"}


def test_events_run_a_user_keys_detectors():
    oracle = events.detect_early_learning(T, U_CURVE, **PARAMS)
    assert oracle is not None
    series = {"sw/e_gen": (T, U_CURVE)}
    assert events.analyze_history(series, **PARAMS).events == []  # not declared: not read
    got = events.analyze_history(series, metric_keys=keys.BUILTIN.with_keys(_user()), **PARAMS).events
    assert [e.name for e in got] == ["sw_e_gen_early_learning"]
    ev = got[0]
    assert (ev.epoch, ev.significance, ev.detected_epoch) == (
        oracle.epoch, oracle.significance, oracle.detected_epoch)
    assert ev.detail["key"] == "sw/e_gen" and ev.detail["detector"] == "early_learning"
    assert ev.describe().startswith("early learning of SW_gen: minimum")


def test_events_minimum_and_double_descent_detectors_on_a_user_key():
    t60 = np.arange(60.0)  # a 20-point piecewise-linear curve is mostly kinks for the noise bound
    dd = np.interp(t60, [0, 15, 33, 59], [3.0, 2.0, 2.8, 1.5])  # down, up, down again
    dd = dd + 0.003 * np.random.default_rng(1).standard_normal(t60.size)
    oracle_dd = events.detect_double_descent(t60, dd, **PARAMS)
    oracle_min = events.detect_icr_minimum(T, U_CURVE, **PARAMS)
    assert oracle_dd is not None and oracle_min is not None
    ks = keys.BUILTIN.with_keys(keys.MetricKey("u/dd", detectors=("double_descent",)),
                                keys.MetricKey("u/min", detectors=("minimum",)))
    got = {e.name: e for e in events.analyze_history(
        {"u/dd": (t60, dd), "u/min": (T, U_CURVE)}, metric_keys=ks, **PARAMS).events}
    assert got["u_dd_double_descent"].epoch == oracle_dd.epoch
    assert got["u_min_minimum"].epoch == oracle_min.epoch
    assert "double descent of u/dd" in got["u_dd_double_descent"].describe()


def test_report_tabulates_a_declared_user_metric(tmp_path):
    pytest.importorskip("matplotlib")
    from lightning_pfd.analysis.report import write_report

    series = {"pfd/e_gen": (T, U_CURVE), "sw/e_gen": (T, 2 * U_CURVE + 1)}
    res = write_report(series, tmp_path, metric_keys=keys.BUILTIN.with_keys(_user()), **PARAMS)
    md = (tmp_path / "report.md").read_text()
    row = next(line for line in md.splitlines() if "`sw/e_gen`" in line)
    y = 2 * U_CURVE + 1
    i, j = int(np.argmin(y)), int(np.argmax(y))
    assert row.startswith("| SW_gen |")
    assert f"{y[i]:.4g} (epoch {i})" in row and f"{y[j]:.4g} (epoch {j})" in row
    names = {e["name"] for e in json.loads((tmp_path / "events.json").read_text())["events"]}
    assert "sw_e_gen_early_learning" in names and "early_learning" in names
    assert res["analysis"].event("sw_e_gen_early_learning") is not None


def test_regime_monitor_emits_events_of_a_user_key(tmp_path):
    import lightning.pytorch as pl

    from lightning_pfd.callbacks.regime import RegimeMonitor
    from test_callback_base import Tiny  # a linear LightningModule

    class Scripted(Tiny):
        def on_validation_epoch_end(self):
            self.log("sw/e_gen", float(U_CURVE[self.current_epoch]))

    oracle = events.detect_early_learning(T, U_CURVE, **PARAMS)
    mon = RegimeMonitor(**PARAMS, write_report=False, verbose=False)
    trainer = pl.Trainer(max_epochs=len(T), logger=False, callbacks=[mon, _Declares(_user())],
                         accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=str(tmp_path))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Scripted())
    assert mon.emitted["sw_e_gen_early_learning"]["epoch"] == oracle.epoch
    assert float(trainer.callback_metrics["events/sw_e_gen_early_learning_epoch"]) == oracle.epoch


def test_off_a_terminal_the_bar_prints_one_line_per_epoch(tmp_path, capsys, monkeypatch):
    """Issue 40 item 14: on a pipe or a log file rich draws no live bar, so each epoch prints one
    plain line (epoch, validation loss, shown metrics); on a terminal it prints none."""
    import warnings

    import lightning.pytorch as pl

    from lightning_pfd.callbacks.progress import PFDProgressBar
    from test_callback_base import Tiny

    for terminal in (False, True):
        monkeypatch.setattr(PFDProgressBar, "on_terminal", staticmethod(lambda: terminal))
        trainer = pl.Trainer(max_epochs=3, logger=False, callbacks=[PFDProgressBar()], accelerator="cpu",
                             enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                             limit_train_batches=1, limit_val_batches=1, default_root_dir=str(tmp_path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Tiny())
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[lightning_pfd] epoch")]
        assert [ln.split()[2] for ln in lines] == ([] if terminal else ["0/2", "1/2", "2/2"])
