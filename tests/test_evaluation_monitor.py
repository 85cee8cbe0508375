"""The measurement contract (lightning_pfd.evaluation.base) and the generic EvaluationMonitor.

An evaluation written only against the contract runs in a fit: one ``log_dict`` per measurement
with every key, tensors logged as they are and Python numbers as float32, the history row, the
per-unit record, the figure schedule; bad arguments are refused naming the field; ``Comm``'s
collectives reassemble strided shards in the global order and agree on a flag.
"""
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_pfd.analysis.per_unit import read_records
from lightning_pfd.callbacks import EvaluationMonitor
from lightning_pfd.data import TensorDataModule
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation import SINGLE, Comm, Evaluation, Measurement, NonFinite, Units
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet


class ParamNorm(Evaluation):
    """Measures the squared norm of every parameter tensor of the model (units: the tensors)."""

    def __init__(self):
        self.prepared = 0

    def leaves(self):
        return ["sq_norm", "count"]

    def prepare(self, datamodule, model, comm=SINGLE):
        self.prepared += 1

    def measure(self, model, comm=SINGLE):
        per = torch.stack([p.detach().double().square().sum() for p in model.parameters()])
        return Measurement({"sq_norm": per.sum(), "count": float(per.numel())},
                           units={"sq_norm": Units("mean", per, torch.arange(per.numel()), float(per.mean()))},
                           history={"first": float(per[0])}, nonfinite=NonFinite(0.0, "parameters"),
                           figures={"bars": lambda epoch: (np.full((4, 4), epoch / 10.0), None)})


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataModule(train_data=torch.randn(16, 3, generator=g), val_data=torch.randn(8, 3, generator=g),
                            batch_size=8, value_range=None)


def _model():
    torch.manual_seed(0)
    return DiffusionModule(MLPNet(3, hidden=8, depth=1, emb_dim=8), family="edm", num_steps=3)


def _trainer(tmp_path, monitor, epochs):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=1, limit_val_batches=1,
                      num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[monitor])


def _fit(tmp_path, monitor, epochs=3):
    dm, model = _data(), _model()
    calls = []
    log_dict = model.log_dict

    def spy(dictionary, **kw):
        calls.append((dict(dictionary), kw))
        return log_dict(dictionary, **kw)
    model.log_dict = spy
    trainer = _trainer(tmp_path, monitor, epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return trainer, model, calls


def test_any_contract_object_runs_with_one_log_dict_per_measurement(tmp_path):
    ev = ParamNorm()
    assert isinstance(ev, Evaluation)
    mon = EvaluationMonitor(ev, name="pn", every_n_epochs=2, figure_every_n=2)
    assert mon.metric_names() == ["pn/sq_norm", "pn/count"]
    trainer, model, calls = _fit(tmp_path, mon, epochs=3)
    mine = [(d, kw) for d, kw in calls if any(k.startswith("pn/") for k in d)]
    assert [sorted(d) for d, _ in mine] == [["pn/count", "pn/sq_norm"]] * 2  # passes 0 and 2, one call each
    assert all(kw["on_epoch"] and not kw["on_step"] and not kw["sync_dist"] for _, kw in mine)
    # the last measurement is of the final model: an independent sum of squares
    expect = sum(float(p.detach().double().square().sum()) for p in model.parameters())
    assert float(trainer.callback_metrics["pn/sq_norm"]) == pytest.approx(expect, rel=1e-12)
    assert trainer.callback_metrics["pn/sq_norm"].dtype == torch.float64  # a tensor as it is
    assert trainer.callback_metrics["pn/count"].dtype == torch.float32  # a number as float32
    assert [h["epoch"] for h in mon.history] == [0, 2] and ev.prepared == 2
    assert mon.history[-1]["pn/first"] == pytest.approx(float(next(model.parameters()).detach().double().square().sum()))
    records, bad = read_records(tmp_path / "per_unit")
    assert not bad and [r.epoch for r in records["pn/sq_norm"]] == [0, 2]
    assert records["pn/sq_norm"][-1].kind == "mean" and len(records["pn/sq_norm"][-1].values) == len(
        list(model.parameters()))
    # figures on passes whose index is a multiple of figure_every_n (no image logger: PNG files)
    pngs = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert pngs == ["pn_bars-epoch0000.png", "pn_bars-epoch0002.png"]


def test_figures_follow_their_own_schedule(tmp_path):
    mon = EvaluationMonitor(ParamNorm(), name="pn", every_n_epochs=1, figure_every_n=3)
    _fit(tmp_path, mon, epochs=4)
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "pn_bars-epoch0000.png", "pn_bars-epoch0003.png"]


class Bound(ParamNorm):
    """ParamNorm that records the data it was checked / prepared on and each reset."""

    def __init__(self):
        super().__init__()
        self.bound, self.resets, self.checks = [], 0, 0

    def check(self, datamodule, model, comm=SINGLE):
        self.checks += 1
        self.bound.append(datamodule.train_data)

    def prepare(self, datamodule, model, comm=SINGLE):
        super().prepare(datamodule, model, comm)
        self.bound.append(datamodule.train_data)

    def reset(self):
        self.resets += 1


def test_an_evaluation_is_reset_only_for_other_data_or_another_model(tmp_path):
    """The pre-flight check binds the evaluation; the fit, a validate after it and a second fit on
    the same datamodule and model keep that binding (no reset, no second check); another
    datamodule or another model is a reset and a new check."""
    ev = Bound()
    mon = EvaluationMonitor(ev, name="pn")
    dm, model = _data(), _model()
    dm.setup("fit")
    mon.check_setup(_trainer(tmp_path, mon, 1), model, dm)  # the command line's pre-flight
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(tmp_path, mon, 2)
        trainer.fit(model, datamodule=dm)
        assert ev.resets == 0 and ev.checks == 1 and ev.prepared == 2
        trainer.validate(model, datamodule=dm, verbose=False)
        assert ev.resets == 0 and ev.checks == 1
        other = _data(seed=1)
        _trainer(tmp_path, mon, 1).fit(model, datamodule=other)
        assert ev.resets == 1 and ev.checks == 2 and ev.bound[-1] is other.train_data
        _trainer(tmp_path, mon, 1).fit(_model(), datamodule=other)
        assert ev.resets == 2
        _trainer(tmp_path, mon, 1).fit(model, datamodule=dm)  # back to the first pair: bound again
        assert ev.resets == 3 and ev.checks == 4
    assert all(b is dm.train_data for b in ev.bound[:4])


@pytest.mark.parametrize("kwargs, field", [
    (dict(evaluation=object()), "evaluation"),
    (dict(evaluation=ParamNorm(), figure_every_n=-1), "figure_every_n"),
    (dict(evaluation=ParamNorm(), name="a/b"), "name"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):  # the command line adds the config path
        EvaluationMonitor(**kwargs)


class _Parts(Comm):
    """Rank ``rank`` of a simulated ``world``: all_gather returns the given per-rank tensors."""

    def __init__(self, rank, world, parts):
        self.rank, self.world, self.parts = rank, world, parts

    def all_gather_equal(self, t):
        return [t if r == self.rank else p for r, p in enumerate(self.parts)]


def test_comm_gathers_strided_shards_in_global_order_and_agrees_on_flags():
    data = torch.arange(20.0).reshape(10, 2)
    world = 3
    padded = [torch.cat([data[r::world], data.new_zeros(4 - len(data[r::world]), 2)]) for r in range(world)]
    for rank in range(world):
        comm = _Parts(rank, world, padded)
        assert torch.equal(comm.shard(10), torch.arange(rank, 10, world))
        assert torch.equal(comm.gather_rows(comm.shard(data), 10), data)
    flags = [torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([0.0])]  # rank 1 failed
    assert _Parts(0, 3, flags).all_true(True) is False
    assert _Parts(0, 3, [torch.tensor([0.0])] * 3).all_true(True) is True
    assert SINGLE.gather_rows(data, 10) is data and SINGLE.all_true(True) and not SINGLE.all_true(False)
    assert torch.equal(SINGLE.reduce_sum(data), data)


def _presets():
    from lightning_pfd.callbacks import GeneralizationMonitor, ICRMonitor, MemorizationMonitor, TailMonitor

    return (GeneralizationMonitor(num_eval=4, batch_size=4, num_loss_samples=None, use_cache=False),
            ICRMonitor(num_images=8), MemorizationMonitor(num_samples=4), TailMonitor(num_samples=4))


def test_checked_monitors_pickle_unbound_for_spawned_processes():
    """ddp_spawn pickles the callbacks after the command line's pre-flight: every preset pickles,
    the copy is bound to nothing and keeps no latest measurement (its figures are functions),
    and a FlowEvaluation copy is unbound (its sources are functions of this process's data)."""
    import pickle
    from types import SimpleNamespace

    dm, model = _data(), _model()
    dm.setup("fit")
    trainer = SimpleNamespace(global_rank=0, world_size=1, strategy=None)
    for mon in _presets():
        trainer.callbacks = [mon]
        mon.check_setup(trainer, model, dm)
        assert mon._bound(dm, model, 1)
        mon.latest = "a measurement with figure functions"
        copy = pickle.loads(pickle.dumps(mon))
        assert copy._bound_to == () and copy.latest is None and mon.latest is not None, mon.preset
        assert copy.preset == mon.preset and copy.state_key == mon.state_key
    flow = pickle.loads(pickle.dumps(_presets()[0].evaluation))
    assert flow.train_data is None and flow._sources == {}


def test_flow_and_tail_bind_again_when_the_datamodule_brings_new_tensors():
    """A datamodule whose setup builds new tensors: the evaluations measure the data of the fit,
    not the pre-flight's."""
    dm, model = _data(), _model()
    dm.setup("fit")
    flow, tail = _presets()[0].evaluation, _presets()[3].evaluation
    for ev in (flow, tail):
        ev.check(dm, model, SINGLE)
    dm.train_data = dm.train_data.clone() + 1.0
    flow.prepare(dm, model, SINGLE)
    tail.prepare(dm, model, SINGLE)
    assert flow.train_data is dm.train_data and tail.data is dm.train_data


def test_flow_precision_follows_the_model_on_its_device():
    """bf16 with the model's sample_autocast is decided on the device the model measures on
    (Lightning moves it after setup, where the pre-flight bound the evaluation in fp32)."""
    from types import SimpleNamespace

    dm = _data()
    dm.setup("fit")
    torch.manual_seed(0)
    model = DiffusionModule(MLPNet(3, hidden=8, depth=1, emb_dim=8), family="edm", num_steps=3, sample_autocast=True)
    flow = _presets()[0].evaluation
    flow.check(dm, model, SINGLE)
    assert flow.settings.precision == "fp32"  # on the CPU
    flow._references = {"teacher": "computed in fp32"}
    flow._follow_model_precision(SimpleNamespace(sample_autocast=True, device=torch.device("cuda", 0)))
    assert flow.settings.precision == "bf16" and flow._references == {}
    flow._follow_model_precision(model)
    assert flow.settings.precision == "fp32"
    explicit = type(flow)(None, num_eval=4, precision="fp32", use_cache=False)
    explicit.check(dm, model, SINGLE)
    explicit._follow_model_precision(SimpleNamespace(sample_autocast=True, device=torch.device("cuda", 0)))
    assert explicit.settings.precision == "fp32"  # given: kept


def test_a_sample_count_beyond_memory_is_refused_by_its_estimate(monkeypatch):
    """Issue 40 item 13: a huge ``num_eval`` / ``num_samples`` is refused at the check by a memory
    estimate naming the argument, the estimate and the machine's memory, before any sampling;
    a count whose estimate fits passes the same check."""
    import lightning_pfd.validation as validation
    from lightning_pfd.callbacks import GeneralizationMonitor, MemorizationMonitor
    from lightning_pfd.errors import ConfigError

    monkeypatch.setattr(validation, "physical_memory", lambda: 2 ** 30)  # a 1 GiB machine
    dm, model = _data(), _model()
    dm.setup("fit")
    # flow: 4 float64 arrays of num_eval x 3 -> 96 bytes a seed; the limit is 0.5 GiB
    fits, too_many = 2 ** 29 // 96, 2 ** 29 // 96 + 1
    GeneralizationMonitor(num_eval=fits, batch_size=4, use_cache=False).evaluation.check(dm, model, SINGLE)
    with pytest.raises(ConfigError, match=r"num_eval: needs about 0\.5 GiB of memory at once \(four float64 "
                                          r"arrays of 5592406 x 3.*than 50% of this machine's 1\.0 GiB"):
        GeneralizationMonitor(num_eval=too_many, batch_size=4, use_cache=False).evaluation.check(dm, model, SINGLE)
    # memorization: a shard of samples as float32 + float64 (12 bytes a value) + 16 + 8 bytes a seed
    per_seed = 12 * 3 + 16 + 8
    MemorizationMonitor(num_samples=2 ** 29 // per_seed).evaluation.check(dm, model, SINGLE)
    with pytest.raises(ConfigError, match=r"num_samples: needs about .* GiB of memory at once \(\d+ generated "
                                          r"samples of 3 values"):
        MemorizationMonitor(num_samples=2 ** 29 // per_seed + 1).evaluation.check(dm, model, SINGLE)


def test_an_evaluation_states_its_contract_and_the_callbacks_do_not_probe_it():
    """Issue 43 item 3: the contract is the base class Evaluation (defaults for every member but
    prepare and measure); an object that only has the two methods is refused, naming the base;
    no module of callbacks/ reads an evaluation member through getattr."""
    import ast
    from pathlib import Path

    from lightning_pfd.callbacks import EvaluationMonitor
    from lightning_pfd.errors import ConfigError

    class Duck:
        def prepare(self, datamodule, model, comm=SINGLE):
            pass

        def measure(self, model, comm=SINGLE):
            return Measurement({"x": 1.0})

    with pytest.raises(ConfigError, match="evaluation: must be a lightning_pfd.evaluation.Evaluation"):
        EvaluationMonitor(Duck())
    ev = ParamNorm()
    mon = EvaluationMonitor(ev, name="pn")  # the defaults: key, metric keys, state
    assert mon.key("sq_norm") == "pn/sq_norm" and mon._extra_state() == {}
    assert [k.key for k in mon.metric_keys()] == ["pn/sq_norm", "pn/count"]
    probed = []
    members = {"default_name", "key", "leaves", "metric_keys", "lower_is_better", "state_key_args", "check",
               "reset", "history_under_leaf", "state_dict", "load_state_dict", "prepare", "measure"}
    for path in (Path(__file__).resolve().parents[1] / "lightning_pfd" / "callbacks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in members and "evaluation" in ast.unparse(node.args[0])):
                probed.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert probed == []
