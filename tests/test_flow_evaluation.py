"""FlowEvaluation and SamplerSettings against closed forms, brute force and the monitor.

* E_gen between two Gaussians equals the PFD of their exact PF-ODE maps (PFD paper eq. 32) on the
  same seeds, and eq. 39 within Monte Carlo error; E_mem, the frozen-noise losses and a user metric
  (sliced Wasserstein) equal brute-force computations;
* two simulated processes (threads exchanging tensors) give the numbers of one;
* references are computed once (in memory and on disk), keyed by the precision; with fp32 no
  autocast is active in any flow, with bf16 it is active in every flow (student and references);
* GeneralizationMonitor logs exactly what ``FlowEvaluation.measure`` returns on the same model,
  including a user metric from a YAML-style ``metrics`` entry;
* memory: the identity descriptor's features are views of the endpoints, metrics are updated in
  batches of ``batch_size`` rows (with the values of one update over all rows);
* bad input is refused with a ConfigError before any sampling.
"""
import functools
import math
import threading

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from helpers.rounding import assert_equal_to_rounding
from helpers.teacher import GaussianTeacherDM
from lightning_pfd.callbacks import GeneralizationMonitor
from lightning_pfd.data import TensorDataModule
from lightning_pfd.diffusion import EDMFamily, EmpiricalDenoiser, GaussianDenoiser, seeded_noise
from lightning_pfd.diffusion.sampling import SamplerSettings, sample_endpoints
from lightning_pfd.diffusion.streams import stream
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation import flow as flow_mod
from lightning_pfd.evaluation.base import Comm
from lightning_pfd.evaluation.flow import FlowEvaluation, check_one_solver
from lightning_pfd.metrics import probability_flow_distance
from lightning_pfd.metrics.baselines import gaussian_pfd
from lightning_pfd.modules import DiffusionModule
from lightning_pfd.nets import MLPNet

T_MEAN, T_COV = torch.tensor([0.5, -0.3, 0.2]), torch.tensor([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.4]])
S_MEAN, S_COV = torch.tensor([0.2, 0.1, -0.1]), torch.tensor([[0.6, -0.1, 0.0], [-0.1, 0.9, 0.2], [0.0, 0.2, 0.3]])


class Counting(nn.Module):
    """A denoiser that counts its calls and records whether autocast was on (and its dtype)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls, self.autocast = inner, 0, set()

    def forward(self, x, sigma):
        self.calls += 1
        on = torch.is_autocast_enabled(x.device.type)
        self.autocast.add(torch.get_autocast_dtype(x.device.type) if on else x.dtype)
        return self.inner(x, sigma)

    def fingerprint(self):
        return self.inner.fingerprint()


class SlicedW2(Metric):
    """Sliced 2-Wasserstein distance between student and reference features (a user metric)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, num_projections: int = 8, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.num_projections, self.seed = num_projections, seed
        self.add_state("student", [], dist_reduce_fx="cat")
        self.add_state("reference", [], dist_reduce_fx="cat")

    def update(self, student, reference):
        self.student.append(student)
        self.reference.append(reference)

    def compute(self):
        s, r = dim_zero_cat(self.student), dim_zero_cat(self.reference)
        theta = _projections(s.shape[1], self.num_projections, self.seed).to(s)
        return ((s @ theta).sort(0).values - (r @ theta).sort(0).values).square().mean().sqrt()


def _projections(dim, n, seed):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(dim, n, generator=g, dtype=torch.float64)
    return theta / theta.norm(dim=0, keepdim=True)


def _train(n=12):
    return GaussianDenoiser(T_MEAN, T_COV).sample(range(n)).float()


def _evaluation(teacher=None, **kw):
    args = dict(test_data=GaussianDenoiser(T_MEAN, T_COV).sample(range(100, 107)).float(),
                teacher=teacher if teacher is not None else GaussianDenoiser(T_MEAN, T_COV),
                num_eval=24, seed_offset=5_000, settings=SamplerSettings(num_steps=6), batch_size=5,
                num_loss_samples=None)
    args.update(kw)
    return FlowEvaluation(_train(), **args)


# ----------------------------------------------------------------------------- closed forms
def test_e_gen_of_two_gaussians_equals_their_exact_flow_maps():
    ev = FlowEvaluation(_train(2), teacher=GaussianDenoiser(T_MEAN, T_COV), num_eval=2048, seed_offset=0,
                        settings=SamplerSettings(num_steps=60), batch_size=2048, use_cache=False)
    student = GaussianDenoiser(S_MEAN, S_COV)
    got = float(ev.evaluate(student).metrics["e_gen"])
    x_T = 80.0 * seeded_noise(torch.arange(2048), (3,), stream=stream("pf_ode.x_T"))
    exact_t = GaussianDenoiser(T_MEAN, T_COV).flow_map(x_T, 80.0, 0.0)
    exact_s = student.flow_map(x_T, 80.0, 0.0)
    on_sample = float(((exact_t - exact_s) ** 2).sum(1).mean().sqrt())
    assert got == pytest.approx(on_sample, rel=3e-3)  # only the solver error of Heun-60 (measured 1.1e-3)
    assert got == pytest.approx(float(gaussian_pfd(T_MEAN, T_COV, S_MEAN, S_COV)), rel=0.03)  # eq. 39


def test_measure_matches_functional_oracles_and_brute_force():
    ev = _evaluation(use_cache=False)
    ev.add_metric("sw/e_gen", functools.partial(SlicedW2, num_projections=8), reference="teacher")
    student, loss = GaussianDenoiser(S_MEAN, S_COV), EDMFamily().loss()
    res = ev.evaluate(student, loss_fn=loss)
    seeds = range(5_000, 5_024)
    kw = dict(seeds=seeds, shape=(3,), settings=ev.settings)
    assert float(res.metrics["e_gen"]) == pytest.approx(
        float(probability_flow_distance(student, GaussianDenoiser(T_MEAN, T_COV), **kw)), rel=1e-9)
    assert float(res.metrics["e_mem"]) == pytest.approx(
        float(probability_flow_distance(student, EmpiricalDenoiser(ev.train_data), **kw)), rel=1e-9)
    with torch.no_grad():
        l_tr = loss(student, ev.train_data, seeds=flow_mod.LOSS_TRAIN_SEED_OFFSET + torch.arange(12)).double().mean()
        l_te = loss(student, ev.test_data, seeds=flow_mod.LOSS_TEST_SEED_OFFSET + torch.arange(7)).double().mean()
    assert float(res.metrics["train_fixed"]) == pytest.approx(float(l_tr), rel=1e-9)
    assert float(res.metrics["gap"]) == pytest.approx(float(l_te - l_tr), rel=1e-9)
    # the user metric, by hand with numpy on the returned features
    f = {k: v.numpy() for k, v in res.features().items()}
    theta = _projections(3, 8, 0).numpy()
    sw = np.sqrt(((np.sort(f["student"] @ theta, 0) - np.sort(f["teacher"] @ theta, 0)) ** 2).mean())
    assert float(res.metrics["sw/e_gen"]) == pytest.approx(sw, rel=1e-12)
    ends = res.endpoints()  # batches of 5 vs one batch of 24: other matmul shapes, equal to rounding
    assert_equal_to_rounding(ends["student"], sample_endpoints(student, seeds, (3,), ev.settings.sigmas()))
    assert res.metrics["nonfinite"] == 0.0 and set(ends) == {"student", "teacher", "empirical"}


@pytest.mark.parametrize("n", [EmpiricalDenoiser.float64_max_n_cpu, EmpiricalDenoiser.float64_max_n_cpu + 1])
def test_empirical_reference_is_the_same_flow_with_either_algorithm(n):
    """Small training sets run the float64 algorithm (faster there on a CPU), larger ones the
    float32 search; both give the empirical flow of eq. 46 to float64 rounding, so the choice
    keys no cache."""
    train = GaussianDenoiser(T_MEAN, T_COV).sample(range(n)).float()
    ev = FlowEvaluation(train, num_eval=16, seed_offset=5_000, settings=SamplerSettings(num_steps=6),
                        batch_size=16, use_cache=False, default_metrics=False)
    den = ev._sources["empirical"].build("cpu")
    den(train[:4].double(), 0.01)
    assert den.last_stats["mode"].startswith("float64") == (n <= EmpiricalDenoiser.float64_max_n_cpu)
    got = ev.compute_references()["empirical"].endpoints
    for precision in ("mixed", "float64"):
        want = ev.settings.sample(EmpiricalDenoiser(train, precision=precision), range(5_000, 5_016), (3,),
                                  batch_size=16)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    nearest = torch.cdist(got, train.double()).min(1).values  # the empirical flow ends on training points
    assert float(nearest.max()) < 1e-2


# ----------------------------------------------------------------------------- processes
class _ThreadGroup:
    def __init__(self, world):
        self.world, self.slots = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=300)


class ThreadCollective(Comm):
    """world processes simulated by threads that exchange tensors through shared slots."""

    def __init__(self, group, rank):
        self.group, self.rank, self.world = group, rank, group.world

    def all_gather_equal(self, t):
        g = self.group
        g.slots[self.rank] = t.clone()
        g.barrier.wait()
        out = [s.clone() for s in g.slots]
        g.barrier.wait()  # nobody overwrites a slot before everyone read it
        return out


def _run_world(world, make_eval, measure):
    group, results, errors = _ThreadGroup(world), [None] * world, []

    def run(rank):
        try:
            results[rank] = measure(make_eval(ThreadCollective(group, rank)))
        except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("nan_odd", [False, True], ids=["finite", "odd_seeds_nan"])
def test_two_simulated_processes_give_the_numbers_of_one(nan_odd):
    def make(comm):
        ev = _evaluation(num_eval=13, use_cache=False, comm=comm)
        ev.add_metric("sw/e_gen", SlicedW2, reference="teacher")
        return ev

    def generate(seeds):  # a model whose samples are NaN for odd seeds (one rank only sees them)
        x = sample_endpoints(GaussianDenoiser(S_MEAN, S_COV), seeds, (3,), SamplerSettings(num_steps=6).sigmas())
        if nan_odd:
            x[seeds % 2 == 1] = math.nan
        return x

    def measure(ev):
        return ev.evaluate(GaussianDenoiser(S_MEAN, S_COV), loss_fn=EDMFamily().loss(), generate=generate, gather=True)

    (single,) = _run_world(1, make, measure)
    pair = _run_world(2, make, measure)
    assert single.metrics["nonfinite"] == (6 / 13 if nan_odd else 0.0)
    assert set(single.metrics) == {"e_gen", "e_mem", "e_gen_se", "e_mem_se", "sw/e_gen", "nonfinite", "train_fixed",
                                   "test_fixed", "gap"}
    assert set(single.per_seed) == {"e_gen", "e_mem"}  # the PFD metrics keep their per-seed d²
    # shards of 7 and 6 rows run other batch shapes than 13 rows in one process: the BLAS may pick
    # other kernels (MKL does), so the numbers agree to rounding (1e-12 relative), not bit for bit
    loss_scale = max(abs(float(single.metrics["train_fixed"])), abs(float(single.metrics["test_fixed"])))
    for res in pair:
        assert set(res.metrics) == set(single.metrics)
        for k, sq in single.per_seed.items():  # gathered in global seed order on every process
            torch.testing.assert_close(res.per_seed[k], sq, rtol=1e-12, atol=1e-15, equal_nan=True)
        for k, v in single.metrics.items():
            if nan_odd and k in ("e_gen", "e_mem", "sw/e_gen", "e_gen_se", "e_mem_se"):
                assert math.isnan(float(res.metrics[k])) and math.isnan(float(v)), k
            elif k == "nonfinite":
                assert float(res.metrics[k]) == float(v)  # a count: exact
            else:  # the gap is a difference of two losses: its rounding is relative to the losses
                scale = loss_scale if k == "gap" else abs(float(v))
                assert float(res.metrics[k]) == pytest.approx(float(v), rel=1e-12, abs=1e-12 * scale), k
        assert_equal_to_rounding(res.student, single.student, equal_nan=True, msg="student")
        for name, ref in single.references.items():
            assert_equal_to_rounding(res.references[name].endpoints, ref.endpoints, msg=name)
    assert [len(r.shard) for r in pair] == [7, 6] and bool(single.metrics["e_gen"].isnan()) == nan_odd


def test_fewer_seeds_than_processes_are_refused():
    group = _ThreadGroup(4)
    with pytest.raises(ConfigError, match="world size 4"):
        _evaluation(num_eval=3, comm=ThreadCollective(group, 0))


# ----------------------------------------------------------------------------- cache, precision
def test_references_are_sampled_once_in_memory_and_on_disk():
    teacher = Counting(GaussianDenoiser(T_MEAN, T_COV))
    ev = _evaluation(teacher=teacher)
    student = Counting(GaussianDenoiser(S_MEAN, S_COV))
    first = ev.evaluate(student).metrics
    per_flow = 11 * 5  # Heun-6: 11 calls per batch, 24 seeds in batches of 5
    assert teacher.calls == per_flow and student.calls == per_flow
    second = ev.evaluate(student).metrics  # the references are kept: only the student is sampled
    assert teacher.calls == per_flow and student.calls == 2 * per_flow
    assert {k: float(v) for k, v in first.items()} == {k: float(v) for k, v in second.items()}
    again = Counting(GaussianDenoiser(T_MEAN, T_COV))
    third = _evaluation(teacher=again).evaluate(student).metrics  # a new evaluation: from the disk cache
    assert again.calls == 0 and float(third["e_gen"]) == float(first["e_gen"])
    other = Counting(GaussianDenoiser(T_MEAN, T_COV))
    ev_bf16 = _evaluation(teacher=other, settings=SamplerSettings(num_steps=6, precision="bf16"))
    assert ev_bf16.cache_key("teacher") != ev.cache_key("teacher")
    assert ev_bf16.cache_key("empirical") != ev.cache_key("empirical")
    ev_bf16.compute_references()
    assert other.calls == per_flow  # another precision: recomputed, not read


class _RowsSeen(SlicedW2):
    """SlicedW2 recording the batch sizes it is updated with (class attribute: one list per test)."""

    rows: list = []

    def update(self, student, reference):
        type(self).rows.append(student.shape[0])
        super().update(student, reference)


def test_memory_identity_features_are_views_and_metrics_are_fed_in_batches():
    """docs/performance.md: a flow holds its endpoints once (the identity features are a view of
    them, not a copy) and metrics see at most ``batch_size`` rows at a time -- with the values
    of one update over all rows (brute force on the returned features)."""
    _RowsSeen.rows = []
    ev = _evaluation(use_cache=False)  # 24 seeds, batch_size 5
    ev.add_metric("sw/e_gen", functools.partial(_RowsSeen, num_projections=8), reference="teacher")
    res = ev.evaluate(GaussianDenoiser(S_MEAN, S_COV))
    for ref in ev.references.values():
        assert ref.features.data_ptr() == ref.endpoints.data_ptr()
        torch.testing.assert_close(ref.features, ref.endpoints.reshape(24, -1), rtol=0, atol=0)
    assert res.student_features.data_ptr() == res.student.data_ptr()
    assert _RowsSeen.rows == [5, 5, 5, 5, 4]
    f = {k: v.numpy() for k, v in res.features().items()}
    theta = _projections(3, 8, 0).numpy()
    sw = np.sqrt(((np.sort(f["student"] @ theta, 0) - np.sort(f["teacher"] @ theta, 0)) ** 2).mean())
    assert float(res.metrics["sw/e_gen"]) == pytest.approx(sw, rel=1e-12)
    whole = probability_flow_distance(GaussianDenoiser(S_MEAN, S_COV), GaussianDenoiser(T_MEAN, T_COV),
                                      seeds=range(5_000, 5_024), shape=(3,), settings=ev.settings)
    assert float(res.metrics["e_gen"]) == pytest.approx(float(whole), rel=1e-12)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_precision_for_every_flow(precision, monkeypatch):
    seen = {}

    class RecordingEmpirical(EmpiricalDenoiser):
        def forward(self, x, sigma):
            on = torch.is_autocast_enabled(x.device.type)
            seen.setdefault("empirical", set()).add(torch.get_autocast_dtype(x.device.type) if on else x.dtype)
            return super().forward(x, sigma)

    monkeypatch.setattr(flow_mod, "EmpiricalDenoiser", RecordingEmpirical)
    teacher, student = Counting(GaussianDenoiser(T_MEAN, T_COV)), Counting(GaussianDenoiser(S_MEAN, S_COV))
    ev = _evaluation(teacher=teacher, settings=SamplerSettings(num_steps=6, precision=precision), use_cache=False)
    res = ev.evaluate(student)
    want = {torch.float64} if precision == "fp32" else {torch.bfloat16}  # fp32: the float64 state, no autocast
    assert teacher.autocast == want and student.autocast == want and seen["empirical"] == want
    if precision == "fp32":  # as before: the plain sampler (batches of 5 vs 24 rows: to rounding)
        assert_equal_to_rounding(res.references["teacher"].endpoints,
                                 sample_endpoints(teacher.inner, range(5_000, 5_024), (3,),
                                                  SamplerSettings(num_steps=6).sigmas()))
    assert all(r.endpoints.dtype == torch.float64 for r in res.references.values())
    assert res.student.dtype == res.student_features.dtype == torch.float64


def test_module_settings_follow_the_module_and_autocast_only_on_cuda():
    torch.manual_seed(0)
    m = DiffusionModule(MLPNet(3, hidden=8, depth=1, emb_dim=8), family="vp", num_steps=7, sampler="euler",
                        sample_autocast=True)
    s = SamplerSettings.from_module(m)
    assert (s.sampler, s.num_steps, s.grid, s.precision) == ("euler", 7, None, "fp32")  # CPU: no autocast
    torch.testing.assert_close(s.sigmas(m.denoiser), m.sigmas, rtol=0, atol=0)
    assert SamplerSettings.from_module(m, precision="bf16").precision == "bf16"
    from types import SimpleNamespace
    on_cuda = SimpleNamespace(sampler_settings=SamplerSettings(num_steps=7), sample_autocast=True,
                              device=torch.device("cuda"), hparams={"sampler": "euler"})
    s = SamplerSettings.from_module(on_cuda)  # no CUDA needed to read the rule; hparams are not read
    assert (s.precision, s.num_steps, s.sampler) == ("bf16", 7, "heun")
    custom = SamplerSettings.from_module(m, sigmas=[10.0, 1.0, 0.0])
    assert custom.grid == (10.0, 1.0, 0.0) and "2 steps" in custom.describe()
    with pytest.raises(ConfigError, match=r"^precision: unknown value"):
        SamplerSettings(precision="fp8")
    for bad in ([1.0, 2.0, 0.0], [80.0], [math.nan, 0.0]):
        with pytest.raises(ConfigError, match="sigmas"):
            SamplerSettings(grid=bad)


# ----------------------------------------------------------------------------- the monitor


def test_monitor_logs_what_measure_returns_including_a_yaml_user_metric(tmp_path):
    torch.manual_seed(0)
    model = DiffusionModule(MLPNet(3, hidden=16, depth=1, emb_dim=8), num_steps=5)
    user = {"pfd_rms/e_gen": {"class_path": "lightning_pfd.metrics.pfd.ProbabilityFlowDistance",
                              "init_args": {"per_dimension": True}, "reference": "teacher"},
            "sw/e_mem": {"class_path": SlicedW2, "reference": "empirical"}}
    cb = GeneralizationMonitor(num_eval=10, batch_size=4, num_loss_samples=None, image_every_n_epochs=0,
                               metrics=user)
    dm = GaussianTeacherDM(T_MEAN, T_COV)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[cb])
    trainer.fit(model, datamodule=dm)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("pfd", "loss/", "sw/"))}
    ev = FlowEvaluation.from_datamodule(dm, model, num_eval=10, batch_size=4, num_loss_samples=None)
    ev.add_metric("pfd_rms/e_gen", functools.partial(flow_mod.ProbabilityFlowDistance, per_dimension=True))
    ev.add_metric("sw/e_mem", SlicedW2, reference="empirical")
    got = ev.evaluate(model.denoiser, loss_fn=model.loss_fn).metrics  # its own sampler, not model.generate
    want = {cb.key(k): float(v) for k, v in got.items()}  # pfd/e_gen, loss/gap, ...; user keys as they are
    assert set(logged) == set(want) and "pfd/e_gen" in want and "loss/gap" in want and len(want) == 10  # + pfd/e_gen_se, pfd/e_mem_se
    for k, v in want.items():
        assert logged[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    assert logged["pfd_rms/e_gen"] == pytest.approx(logged["pfd/e_gen"] / math.sqrt(3), rel=1e-12)
    from lightning_pfd import keys
    assert keys.collect([cb]).get("sw/e_mem").lower_is_better is True and "sw/e_mem" in cb.metric_names()


def test_monitor_refuses_a_user_metric_against_a_missing_reference():
    dm = TensorDataModule(train_data=_train(), batch_size=4, value_range=None)
    dm.setup("fit")
    cb = GeneralizationMonitor(num_eval=4, metrics={"sw/e_gen": {"class_path": SlicedW2, "reference": "teacher"}})
    torch.manual_seed(0)
    module = DiffusionModule(MLPNet(3, hidden=8, depth=1, emb_dim=8))
    with pytest.raises(ConfigError, match="teacher") as err:
        cb.check_setup(type("W", (), {"world_size": 1, "callbacks": [cb]})(), module, dm)
    assert err.value.field == "metrics.sw/e_gen.reference" and err.value.accepted == ["empirical"]
    with pytest.raises(ConfigError, match="class_path"):
        GeneralizationMonitor(metrics={"sw/e_gen": {"class_path": "no_such_pkg.Metric"}})
    with pytest.raises(ConfigError, match="unknown entries"):
        GeneralizationMonitor(metrics={"sw/e_gen": {"class_path": SlicedW2, "refrence": "teacher"}})
    with pytest.raises(ConfigError, match="precision"):
        GeneralizationMonitor(precision="fp64")


# ----------------------------------------------------------------------------- bad input
def test_bad_arguments_are_refused_before_any_sampling():
    teacher = Counting(GaussianDenoiser(T_MEAN, T_COV))
    for kw, field in ((dict(num_eval=0), "num_eval"), (dict(batch_size=0), "batch_size"),
                      (dict(num_loss_samples=0), "num_loss_samples"), (dict(seeds=[]), "seeds")):
        with pytest.raises(ConfigError) as err:
            _evaluation(teacher=teacher, **kw)
        assert err.value.field == field
    ev = _evaluation(teacher=teacher)
    with pytest.raises(ConfigError, match="already measured"):
        ev.add_metric("e_gen", SlicedW2)
    with pytest.raises(ConfigError, match="update"):
        ev.add_metric("bad", lambda: object())
    with pytest.raises(ConfigError, match="fingerprint"):
        _evaluation(teacher=lambda x, s: x)
    with pytest.raises(ConfigError, match="descriptor"):
        _evaluation(teacher=teacher, descriptor=nn.Conv2d(1, 1, 1))  # an image net on vectors
    assert teacher.calls == 0


def test_a_teacher_grid_other_than_the_evaluation_grid_is_refused():
    from lightning_pfd.data import TeacherDistillationDataModule

    dm = TeacherDistillationDataModule(teacher={"mean": [0.5, -0.3], "cov": [[1.0, 0.3], [0.3, 0.5]]},
                                       n_train=4, n_test=2, n_gen=16, num_steps=6)
    dm.setup("fit")
    check_one_solver(SamplerSettings(num_steps=6), dm, dm.teacher)  # the same solver passes
    with pytest.raises(ConfigError) as err:
        check_one_solver(SamplerSettings(num_steps=6, rho=3.0), dm, dm.teacher)
    assert err.value.field == "model.rho" and "rho=3" in err.value.problem  # the model's argument
    with pytest.raises(ConfigError) as err:
        check_one_solver(SamplerSettings(num_steps=6, sampler="euler"), dm, dm.teacher)
    assert err.value.field == "model.sampler" and err.value.accepted == ["heun"]
    with pytest.raises(ConfigError) as err:  # the caller's own argument
        check_one_solver(SamplerSettings(num_steps=6, sampler="euler"), dm, dm.teacher, overridden={"sampler"})
    assert err.value.field == "sampler" and err.value.accepted == ["heun"]
    # precision is not part of the teacher data's solver: bf16 evaluation of a fp32 data set is fine
    check_one_solver(SamplerSettings(num_steps=6, precision="bf16"), dm, dm.teacher)
