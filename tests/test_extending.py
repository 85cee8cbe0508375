"""docs/extending.md runs as written.

The code blocks of the page whose first line is ``# file: NAME`` are written into a temporary
directory on ``sys.path``:

- the user metric (``my_metrics.py`` + the one ``metrics:`` line of the quickstart's
  GeneralizationMonitor) in a 2-epoch fit of the quickstart setting, shrunk, through
  ``lightning_pfd.cli.main``: the logged SW_2 equals an independent numpy SW_2 of the monitor's
  own evaluation endpoints, and the key reaches the CSV log, the progress bar, the W&B metric
  definitions and the report; the monitor of section 4 and the notebook of section 5 run in/on
  the same fit;
- the metric of a new kind (``my_evaluations.py`` + the one ``EvaluationMonitor`` entry of
  ``quickstart_nn.yaml``) in a 2-epoch fit of the shrunk quickstart through the command line:
  the logged nearest-neighbour distance and its per-unit record equal a numpy nearest-neighbour
  search on the trained model's samples;
- the iDDPM family (``my_families.py``): its coefficients, sigma table, grid and training sigmas
  against the EDM paper's Table 1 written out independently in numpy, the exact Gaussian
  denoiser recovered through its preconditioning, and a short fit of ``iddpm.yaml`` through the
  page's launcher ``fit.py`` (``family: iddpm`` + ``family_args``) with finite samples.
"""
import csv
import math
import re
import runpy
import sys
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import scipy.stats
import torch
import yaml

from lightning_pfd import keys
from lightning_pfd.cli import CONFIG_DIR, main
from lightning_pfd.diffusion import GaussianDenoiser
from lightning_pfd.diffusion.families import _FAMILIES, build_family, get_family
from lightning_pfd.errors import ConfigError
from lightning_pfd.evaluation.base import Comm
from lightning_pfd.launch.cli import PFDLightningCLI

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
_BLOCK = re.compile(r"```(?:python|yaml)\n(# file: (\S+)[^\n]*\n.*?)```", re.S)
FILES = {"my_metrics.py", "quickstart_sw.yaml", "my_families.py", "iddpm.yaml", "fit.py",
         "my_detectors.py", "quickstart_settled.yaml",
         "my_monitor.py", "notebook.py", "my_evaluations.py", "quickstart_nn.yaml"}


def doc_blocks() -> dict:
    """{file name: text} of the page's ``# file:`` blocks."""
    blocks = {}
    for m in _BLOCK.finditer(DOC.read_text()):
        assert m.group(2) not in blocks, f"two blocks named {m.group(2)}"
        blocks[m.group(2)] = m.group(1)
    return blocks


@pytest.fixture
def ext(tmp_path, monkeypatch):
    """The page's files in tmp_path/ext, importable; the keys and families they register (and
    their modules) are removed afterwards."""
    d = tmp_path / "ext"
    d.mkdir()
    blocks = doc_blocks()
    for name, text in blocks.items():
        (d / name).write_text(text)
    monkeypatch.syspath_prepend(str(d))
    saved_families = dict(_FAMILIES)
    yield d
    for mod in ("my_metrics", "my_families", "my_monitor", "my_evaluations", "my_detectors"):
        sys.modules.pop(mod, None)
    from lightning_pfd.analysis.detectors import registered_detectors, unregister_detector

    for name, where in registered_detectors().items():  # the page's detector watches pfd/e_gen
        if where.startswith("my_detectors."):
            unregister_detector(name)
    _FAMILIES.clear()
    _FAMILIES.update(saved_families)


def _run_cli(monkeypatch, runner):
    """Run ``runner()`` (the command line, in-process) and return (its exit code, the CLI object)."""
    seen = []
    init = PFDLightningCLI.__init__

    def spy(self, *a, **k):
        seen.append(self)
        init(self, *a, **k)

    monkeypatch.setattr(PFDLightningCLI, "__init__", spy)
    code = runner()
    assert len(seen) == 1
    return code, seen[0]


def _csv_rows(root: Path) -> list:
    (path,) = list(root.rglob("metrics.csv"))
    return list(csv.DictReader(path.open()))


def test_the_page_has_every_example_block():
    assert set(doc_blocks()) == FILES


# ------------------------------------------------------------------ 1. the metric
def _sw_numpy(s: np.ndarray, t: np.ndarray, theta: np.ndarray) -> float:
    """SW_2 estimate: root mean over directions and ranks of the squared sorted-projection gaps."""
    ps, pt = np.sort(s @ theta.T, axis=0), np.sort(t @ theta.T, axis=0)
    return float(np.sqrt(np.mean((ps - pt) ** 2)))


def test_sliced_wasserstein_against_closed_forms(ext):
    import my_metrics

    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 7, generator=g, dtype=torch.float64)
    y = 0.5 * torch.randn(50, 7, generator=g, dtype=torch.float64) + 1.0
    theta = my_metrics.directions(64, 7, seed=0)
    assert theta.shape == (64, 7) and theta.dtype == torch.float64
    np.testing.assert_allclose(theta.norm(dim=1).numpy(), 1.0, rtol=1e-12)
    assert torch.equal(theta, my_metrics.directions(64, 7, seed=0))
    assert not torch.allclose(theta, my_metrics.directions(64, 7, seed=1))
    # uniform on the sphere: on S^2 every coordinate is U(-1, 1) (Archimedes), and on S^{F-1}
    # E theta theta^T = I / F, hence E <theta, d>^2 = ||d||^2 / F (the page's bound SW <= E_gen / sqrt(F))
    many = my_metrics.directions(20000, 3, seed=0).numpy()
    for k in range(3):
        assert scipy.stats.kstest(many[:, k], "uniform", args=(-1, 2)).pvalue > 1e-3
    cov = np.einsum("li,lj->ij", *[my_metrics.directions(20000, 7, seed=0).numpy()] * 2) / 20000
    np.testing.assert_allclose(cov, np.eye(7) / 7, atol=0.01)

    def sw(a, b, **kw):
        m = my_metrics.SlicedWasserstein(**kw)
        m.update(a, b)
        return float(m.compute())

    # a translation by c moves every sorted projection by <theta, c>: SW^2 = mean_l <theta_l, c>^2
    c = torch.tensor([0.3, -1.0, 2.0, 0.0, 0.5, 0.1, -0.2], dtype=torch.float64)
    assert sw(x, x + c) == pytest.approx(float((theta @ c).square().mean().sqrt()), rel=1e-12)
    # an independent numpy estimate with the same directions; rows of one flow in any order
    assert sw(x, y) == pytest.approx(_sw_numpy(x.numpy(), y.numpy(), theta.numpy()), rel=1e-12)
    assert sw(x[torch.randperm(50, generator=g)], y) == pytest.approx(sw(x, y), rel=1e-12)
    # sorting is the best matching per direction: never above the matching by row (by seed)
    assert sw(x, y) <= float(((x - y) @ theta.T).square().mean().sqrt())
    # states concatenate: two updates are one update of all rows
    m = my_metrics.SlicedWasserstein()
    m.update(x[:20], y[:20])
    m.update(x[20:], y[20:])
    assert float(m.compute()) == pytest.approx(sw(x, y), rel=1e-12)
    assert sw(x, y, num_projections=8, seed=5) == pytest.approx(
        _sw_numpy(x.numpy(), y.numpy(), my_metrics.directions(8, 7, 5).numpy()), rel=1e-12)
    with pytest.raises(ValueError, match="num_projections"):
        my_metrics.SlicedWasserstein(num_projections=0)


class _ThreadCollective(Comm):
    """``world`` processes simulated by threads exchanging tensors through shared slots."""

    def __init__(self, slots, barrier, rank):
        self.slots, self.barrier, self.rank, self.world = slots, barrier, rank, len(slots)

    def all_gather_equal(self, t):
        self.slots[self.rank] = t.clone()
        self.barrier.wait()
        out = [s.clone() for s in self.slots]
        self.barrier.wait()
        return out


def test_sliced_wasserstein_over_processes_is_the_single_process_value(ext):
    """Each simulated rank updates with its [rank::world] shard of the rows, as FlowEvaluation
    does; compute() gathers the concatenated states through the evaluation's collective."""
    import my_metrics

    g = torch.Generator().manual_seed(4)
    x = torch.randn(13, 5, generator=g, dtype=torch.float64)
    y = torch.randn(13, 5, generator=g, dtype=torch.float64) * 2
    single = my_metrics.SlicedWasserstein()
    single.update(x, y)
    expected = float(single.compute())
    world, slots, out, errors = 3, [None] * 3, [None] * 3, []
    barrier = threading.Barrier(world, timeout=300)

    def rank_run(rank):
        try:
            comm = _ThreadCollective(slots, barrier, rank)
            m = my_metrics.SlicedWasserstein(dist_sync_fn=comm.gather_all, distributed_available_fn=comm.distributed)
            m.update(x[rank::world], y[rank::world])
            out[rank] = float(m.compute())
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert out == pytest.approx([expected] * world, rel=1e-12)


def _quickstart_shrunk(ext: Path, root: Path) -> dict:
    """configs/quickstart.yaml shrunk (tiny MLP, 2 epochs of 2 steps, num_eval 32, no ICR /
    memorization, CSV logging), with the page's metrics line and monitor."""
    cfg = yaml.safe_load((CONFIG_DIR / "quickstart.yaml").read_text())
    (doc_monitor,) = yaml.safe_load((ext / "quickstart_sw.yaml").read_text())
    gm = next(c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("GeneralizationMonitor"))
    # the page's excerpt is the quickstart's monitor with exactly one added entry, `metrics`
    assert doc_monitor["class_path"] == gm["class_path"]
    assert {k: v for k, v in doc_monitor["init_args"].items() if k != "metrics"} == gm["init_args"]
    assert "metrics" not in gm["init_args"]
    cfg["trainer"].update(max_epochs=2, accelerator="cpu", default_root_dir=str(root), log_every_n_steps=1,
                          logger={"class_path": "lightning.pytorch.loggers.CSVLogger",
                                  "init_args": {"save_dir": str(root), "name": "csv"}})
    callbacks = [
        {"class_path": gm["class_path"],
         "init_args": {"num_eval": 32, "num_loss_samples": 32, "metrics": doc_monitor["init_args"]["metrics"]}},
        {"class_path": "my_monitor.EndpointScatterMonitor", "init_args": {"num_eval": 32}},
        {"class_path": "lightning_pfd.callbacks.RegimeMonitor", "init_args": {"window": 3, "confirm": 2}},
        {"class_path": "lightning_pfd.callbacks.PFDProgressBar"},
    ]
    cfg["trainer"]["callbacks"] = callbacks
    cfg["model"]["init_args"].update(num_steps=6)
    cfg["model"]["init_args"]["net"]["init_args"].update(hidden=32, depth=1)
    cfg["data"]["init_args"].update(n_components=4, n_train=32, n_test=32, batch_size=16,
                                    samples_per_epoch=32, num_steps=6)
    return cfg


class _FakeWandbRun:
    def __init__(self):
        self.defined = {}

    def define_metric(self, name, **kwargs):
        self.defined[name] = kwargs


def test_user_metric_every_epoch_next_to_e_gen(ext, tmp_path, monkeypatch):
    from lightning_pfd.callbacks import PFDProgressBar, RegimeMonitor
    from lightning_pfd.callbacks.progress import format_pfd_metrics
    from lightning_pfd.callbacks.wandb_setup import setup_wandb_metrics

    root = tmp_path / "run"
    cfg_path = tmp_path / "quickstart_sw.yaml"
    cfg_path.write_text(yaml.safe_dump(_quickstart_shrunk(ext, root)))
    with mock.patch.object(sys, "argv", ["python -m lightning_pfd"]):
        code, cli = _run_cli(monkeypatch, lambda: main(["fit", "--config", str(cfg_path)]))
    assert code == 0
    trainer, model, dm = cli.trainer, cli.model, cli.datamodule

    # the key is the one my_metrics.py's class declares (not a plain one)
    import my_metrics

    declared = keys.MetricKey("sw/e_gen", "SW_gen", lower_is_better=True, detectors=("early_learning",),
                              progress_bar=True, description="Sliced Wasserstein-2, student vs teacher endpoints.")
    assert keys.collect(trainer.callbacks).get("sw/e_gen") == declared
    assert keys.find("sw/e_gen") is None  # nothing process-wide
    monitor = next(c for c in trainer.callbacks if getattr(c, "preset", None) == "GeneralizationMonitor")
    ev = monitor.evaluation
    assert ev.flow_metric_keys() == ["e_gen", "e_mem", "sw/e_gen"] and ev.metric_reference("sw/e_gen") == "teacher"

    # CSV: a value per epoch next to E_gen, equal to the monitor's history
    rows = [r for r in _csv_rows(root) if r.get("pfd/e_gen")]
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    logged = [float(r["sw/e_gen"]) for r in rows]
    assert logged == pytest.approx([h["sw/e_gen"] for h in monitor.history], rel=1e-12)
    assert all(math.isfinite(v) and v > 0 for v in logged)

    # the oracle: the monitor's evaluation re-measured on the trained model (the state of the last
    # measurement: no step after it), numpy SW_2 on its Psi features with the same directions
    gen = lambda seeds: model.generate(seeds, sampler=ev.settings.sampler, batch_size=ev.batch_size)  # noqa: E731
    res = ev.evaluate(model.denoiser, generate=gen, device=model.device)
    feats = res.features()
    s, t = feats["student"].cpu().numpy(), feats["teacher"].numpy()
    assert s.shape == t.shape == (32, 64)
    e_gen = float(np.sqrt(np.mean(np.sum((s - t) ** 2, axis=1))))  # eq. 4: same endpoints as logged
    assert e_gen == pytest.approx(float(rows[-1]["pfd/e_gen"]), rel=1e-10)
    theta = my_metrics.directions(64, 64, seed=0).numpy()
    assert logged[-1] == pytest.approx(_sw_numpy(s, t, theta), rel=1e-10)
    assert logged[-1] <= float(np.sqrt(np.mean(((s - t) @ theta.T) ** 2)))  # never above the paired cost

    # progress bar, W&B definitions, report
    bar = next(c for c in trainer.callbacks if isinstance(c, PFDProgressBar))
    assert bar.show["SW_gen"] == "sw/e_gen"
    assert format_pfd_metrics(trainer.callback_metrics, bar.show)["SW_gen"] == f"{logged[-1]:.4g}"
    run = _FakeWandbRun()
    setup_wandb_metrics(run, metric_keys=keys.collect(trainer.callbacks))
    assert run.defined["sw/e_gen"] == {"step_metric": "epoch", "summary": "min,last"}
    assert run.defined["sw/*"] == {"step_metric": "epoch"}
    regime = next(c for c in trainer.callbacks if isinstance(c, RegimeMonitor))
    report = Path(regime.report_paths["markdown"]).read_text()
    assert "| SW_gen | `sw/e_gen` | 2 |" in report
    # the `report` command, later: the key comes back from the run's saved detector settings
    from lightning_pfd.commands.report import main as report_main

    assert report_main([str(root), "--source", "csv", "--out", str(tmp_path / "later")]) == 0
    assert "| SW_gen | `sw/e_gen` | 2 |" in (tmp_path / "later" / "report.md").read_text()

    # section 4: the monitor measured at passes 0 and 1 of its log schedule, logged a scalar
    # and a figure each time
    import my_monitor

    scatter = next(c for c in trainer.callbacks if isinstance(c, my_monitor.EndpointScatterMonitor))
    assert scatter.schedule.kind == "log" and [h["epoch"] for h in scatter.history] == [0, 1]
    # the passes the page lists for schedule="log"
    assert [i for i in range(130) if scatter.schedule.is_due(i)] == [0, 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128]
    shift = [float(r["scatter/mean_shift"]) for r in _csv_rows(root) if r.get("scatter/mean_shift")]
    assert shift == pytest.approx([h["scatter/mean_shift"] for h in scatter.history], rel=1e-6)
    ends = res.endpoints()
    expected = float((ends["student"].cpu().flatten(1).mean(0) - ends["teacher"].flatten(1).mean(0)).norm())
    assert shift[-1] == pytest.approx(expected, rel=1e-5)
    pngs = sorted(p.name for p in root.rglob("figures/*.png"))
    assert pngs == ["scatter_pca-epoch0000.png", "scatter_pca-epoch0001.png"]

    # section 5: the notebook on the trained model and its datamodule
    nb = runpy.run_path(str(ext / "notebook.py"), init_globals={"model": model, "dm": dm})
    assert nb["flow_metrics"]["e_gen"] == pytest.approx(float(rows[-1]["pfd/e_gen"]), rel=1e-10)
    assert nb["flow_metrics"]["sw/e_gen"] == pytest.approx(logged[-1], rel=1e-10)
    assert nb["e_gen"] == pytest.approx(nb["flow_metrics"]["e_gen"], rel=1e-12)
    assert {"e_mem", "nonfinite", "train_fixed", "test_fixed", "gap"} <= set(nb["flow_metrics"])
    assert nb["features"]["empirical"].shape == (32, 64)
    assert math.isfinite(nb["icr"]["icr"]) and nb["icr"]["d"] == 16
    assert set(nb["tails"]) == {"rmsqe", "loader", "nonfinite", "rmsqe_floor", "loader_floor",
                                "rmsqe_clipped", "loader_clipped", "above_range", "below_range",
                                "rmsqe_top_share"}
    assert all(math.isfinite(v) for v in nb["tails"].values())


# ------------------------------------------------------------------ 2. the family
def _table(M=1000, C_1=0.001, C_2=0.008) -> np.ndarray:
    """EDM paper Table 1 (iDDPM): for j >= 1, where the ratio abar_{j-1}/abar_j exceeds C_1, the
    recursion telescopes to u_j = sqrt(abar_M / abar_j - 1); u_0 takes the clipped step."""
    abar = np.sin(0.5 * np.pi * np.arange(M + 1) / (M * (C_2 + 1))) ** 2
    assert np.all(abar[:-1][1:] / abar[1:][1:] >= C_1)  # only the first step is clipped
    u = np.zeros(M + 1)
    u[1:] = np.sqrt(abar[M] / abar[1:] - 1)
    u[0] = np.sqrt((u[1] ** 2 + 1) / C_1 - 1)
    return u


def test_iddpm_family_is_the_papers_column(ext):
    from my_families import IDDPMFamily

    fam = get_family("iddpm")()
    assert isinstance(fam, IDDPMFamily) and fam == IDDPMFamily(M=1000, C_1=0.001, C_2=0.008, j_0=8)
    u = _table()
    np.testing.assert_allclose(fam.u.numpy(), u, rtol=1e-9, atol=0)
    # the numbers the page states
    assert u[0] == pytest.approx(20291, rel=1e-4) and u[8] == pytest.approx(80.2, rel=1e-3)
    assert u[999] == pytest.approx(0.00643, rel=1e-3)
    assert fam.sigma_range == (float(fam.u[999]), float(fam.u[0]))

    sigma = torch.tensor([0.003, 0.00643, 0.05, 0.5, 1.0, 7.3, 80.2, 3000.0, 20291.0], dtype=torch.float64)
    c_skip, c_out, c_in, c_noise = fam.coefficients(sigma)
    sig = sigma.numpy()
    np.testing.assert_array_equal(c_skip.numpy(), 1.0)
    np.testing.assert_array_equal(c_out.numpy(), -sig)
    np.testing.assert_allclose(c_in.numpy(), 1 / np.sqrt(sig**2 + 1), rtol=1e-15)
    nearest = np.array([np.argmin(np.abs(u - s)) for s in sig])  # argmin_j |u_j - sigma| by brute force
    np.testing.assert_array_equal(c_noise.numpy(), 999 - nearest)
    np.testing.assert_allclose(fam.weight(sigma).numpy(), sig**-2.0, rtol=1e-15)

    for n in (18, 100):  # t_i = u_floor(j_0 + (M - 1 - j_0) i / (N - 1) + 1/2), t_N = 0
        idx = np.floor(8 + 991 * np.arange(n) / (n - 1) + 0.5).astype(int)
        grid = fam.default_grid(n)
        assert grid.dtype == torch.float64 and len(grid) == n + 1 and float(grid[-1]) == 0.0
        np.testing.assert_allclose(grid[:-1].numpy(), u[idx], rtol=1e-9)
        assert idx[0] == 8 and idx[-1] == 999


def test_iddpm_training_sigma_is_uniform_over_the_table(ext):
    from my_families import IDDPMFamily

    fam = IDDPMFamily(M=10, j_0=2)
    table = fam.u.numpy()
    for draws in (fam.sample_sigma(20000, "cpu", seeds=torch.arange(20000)),
                  (torch.manual_seed(0), fam.sample_sigma(20000, "cpu"))[1]):
        assert draws.dtype == torch.float32
        j = np.array([np.argmin(np.abs(table - d)) for d in draws.double().numpy()])
        np.testing.assert_allclose(draws.double().numpy(), table[j], rtol=1e-6)  # sigma = u_j
        counts = np.bincount(j, minlength=11)
        assert counts[10] == 0  # j ~ U{0..M-1}: never u_M = 0
        assert scipy.stats.chisquare(counts[:10]).pvalue > 1e-3
    s = fam.sample_sigma(20000, "cpu", seeds=torch.arange(20000))
    assert torch.equal(fam.sample_sigma(3, "cpu", seeds=torch.tensor([5, 6, 7])), s[5:8])  # frozen draws


class _ExactNet(torch.nn.Module):
    """F = (D*(x; sigma) - x) / (-sigma) with sigma = u_{M-1-c_noise} and x = x_in / c_in(sigma):
    the network whose iDDPM-preconditioned denoiser is the exact Gaussian one on the table."""

    def __init__(self, u, gauss):
        super().__init__()
        self.u, self.gauss = u, gauss

    def forward(self, x_in, c_noise):
        sigma = self.u[len(self.u) - 2 - c_noise.round().long()][:, None]
        x = x_in.double() * (sigma**2 + 1).sqrt()
        return (self.gauss(x, sigma[:, 0]) - x) / (-sigma)


def test_exact_network_through_iddpm_preconditioning_is_the_exact_gaussian_denoiser(ext):
    from my_families import IDDPMFamily

    fam = IDDPMFamily()
    d = 4
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(d, d, generator=gen, dtype=torch.float64)
    gauss = GaussianDenoiser(torch.randn(d, generator=gen, dtype=torch.float64),
                             A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64))
    D = fam.precondition(_ExactNet(fam.u, gauss))
    sigma = fam.u[[999, 900, 600, 300, 100, 30, 8]].float()  # on the table: c_noise identifies sigma
    x = gauss.sample(torch.arange(7)).float() + sigma[:, None] * torch.randn(7, d, generator=gen)
    torch.testing.assert_close(D(x, sigma).double(), gauss(x.double(), sigma.double()), rtol=2e-5, atol=2e-5)


def test_iddpm_bad_parameters_name_the_config_field(ext):
    import my_families  # noqa: F401

    for args, field in (({"M": 1}, "family_args.M"),
                        ({"j_0": 999}, "family_args.j_0"),
                        ({"C_1": 0.0}, "family_args.C_1"),
                        ({"C1": 0.1}, "family_args")):
        with pytest.raises(ConfigError) as e:
            build_family("iddpm", {}, args)
        assert e.value.field == field


def _iddpm_run_config(ext: Path, tmp_path: Path, **model_args) -> tuple:
    """The page's iddpm.yaml (net shrunk, 6 sampling steps; ``model_args`` replace entries) with
    a 4-step run on the digits vectors, CSV logging: (config path, run root)."""
    root = tmp_path / "run"
    cfg = yaml.safe_load((ext / "iddpm.yaml").read_text())
    assert cfg["model"]["init_args"]["family"] == "iddpm"
    cfg["model"]["init_args"]["net"]["init_args"].update(hidden=32, depth=1)
    cfg["model"]["init_args"]["num_steps"] = 6
    for k, v in model_args.items():
        if v is None:
            cfg["model"]["init_args"].pop(k)
        else:
            cfg["model"]["init_args"][k] = v
    cfg.update(seed_everything=0,
               trainer={"max_epochs": 1, "accelerator": "cpu", "devices": 1, "limit_train_batches": 4,
                        "limit_val_batches": 2, "default_root_dir": str(root), "enable_progress_bar": False,
                        "enable_model_summary": False, "log_every_n_steps": 1,
                        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                   "init_args": {"save_dir": str(root)}}},
               data={"class_path": "lightning_pfd.data.DigitsDataModule",
                     "init_args": {"as_vector": True, "batch_size": 32}})
    cfg_path = tmp_path / "iddpm_run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg_path, root


def test_iddpm_yaml_fit_through_the_launcher(ext, tmp_path, monkeypatch):
    from lightning_pfd.modules import DiffusionModule

    cfg_path, root = _iddpm_run_config(ext, tmp_path)

    def launch():  # `python fit.py fit --config iddpm_run.yaml`
        with mock.patch.object(sys, "argv", [str(ext / "fit.py"), "fit", "--config", str(cfg_path)]):
            with pytest.raises(SystemExit) as e:
                runpy.run_path(str(ext / "fit.py"), run_name="__main__")
        return e.value.code

    code, cli = _run_cli(monkeypatch, launch)
    assert code == 0
    from my_families import IDDPMFamily

    model = cli.model
    assert model.family == IDDPMFamily() and model.hparams.family == "iddpm"
    assert model.hparams.family_args == {"M": 1000, "C_1": 0.001, "C_2": 0.008, "j_0": 8}
    assert int(model.ema.num_updates) == 4
    val = [float(r["val/loss"]) for r in _csv_rows(root) if r.get("val/loss")]
    assert len(val) == 1 and math.isfinite(val[0])
    # the module's grid is clamped to [u_{M-1}, u_0]; samples on it and on Table 1's grid (Euler)
    pos = model.sigmas[model.sigmas > 0]
    assert float(pos.min()) == pytest.approx(float(model.family.u[999]))
    for kw in ({}, {"sigmas": model.family.default_grid(100), "sampler": "euler"}):
        x = model.generate(torch.arange(8), **kw)
        assert x.shape == (8, 64) and bool(torch.isfinite(x).all())
    loaded = DiffusionModule.load_from_checkpoint(next(root.rglob("*.ckpt")))
    assert loaded.family == model.family


def test_iddpm_named_by_class_path_in_the_yaml_needs_no_launcher(ext, tmp_path, monkeypatch):
    from lightning_pfd.diffusion.families import family_names

    assert "iddpm" not in family_names()  # nothing imported my_families yet
    cfg_path, root = _iddpm_run_config(ext, tmp_path, family_args=None,
                                       family={"class_path": "my_families.IDDPMFamily", "init_args": {"M": 1000}})
    with mock.patch.object(sys, "argv", ["python -m lightning_pfd"]):
        code, cli = _run_cli(monkeypatch, lambda: main(["fit", "--config", str(cfg_path)]))
    assert code == 0 and "iddpm" in family_names()
    assert cli.model.hparams.family == "iddpm" and cli.model.family == get_family("iddpm")()


def test_iddpm_from_python_by_name_or_object(ext):
    from my_families import IDDPMFamily

    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    by_name = DiffusionModule(MLPNet(3, hidden=8, depth=1), family="iddpm", family_args={"M": 1000})
    by_object = DiffusionModule(MLPNet(3, hidden=8, depth=1), family=IDDPMFamily(M=1000))
    assert by_name.family == by_object.family == IDDPMFamily()
    assert by_name.hparams.family == by_object.hparams.family == "iddpm"


# ------------------------------------------------------------------ 6. a metric of a new kind
def test_new_kind_of_metric_declares_its_ranges(ext, tmp_path, capsys):
    """The page's evaluation refuses num_samples = 0 from Python (naming the argument) and from
    its config block (naming the full config path) before anything is written."""
    import my_evaluations
    from lightning_pfd.launch.cli import PFDLightningCLI

    with pytest.raises(ValueError, match=r"^num_samples: must be an integer > 0; got 0$"):
        my_evaluations.NearestNeighbourDistance(num_samples=0)
    root = tmp_path / "run"
    cfg = _quickstart_shrunk(ext, root)
    (entry,) = yaml.safe_load((ext / "quickstart_nn.yaml").read_text())
    entry["init_args"]["evaluation"]["init_args"]["num_samples"] = 0
    cfg["trainer"]["callbacks"] = [entry]
    cfg_path = tmp_path / "quickstart_nn.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(SystemExit) as e:
        PFDLightningCLI(args=["--config", str(cfg_path)], run=False)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert 'Parser key "trainer.callbacks[EvaluationMonitor].evaluation.init_args.num_samples"' in err
    assert not root.exists()


def test_new_kind_of_metric_from_one_file_and_one_config_block(ext, tmp_path, monkeypatch):
    from lightning_pfd.analysis.per_unit import read_records, value_and_se
    from lightning_pfd.callbacks import EvaluationMonitor

    root = tmp_path / "run"
    cfg = _quickstart_shrunk(ext, root)
    (entry,) = yaml.safe_load((ext / "quickstart_nn.yaml").read_text())  # the page's block, as written
    cfg["trainer"]["callbacks"] = [entry]
    cfg_path = tmp_path / "quickstart_nn.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    with mock.patch.object(sys, "argv", ["python -m lightning_pfd"]):
        code, cli = _run_cli(monkeypatch, lambda: main(["fit", "--config", str(cfg_path)]))
    assert code == 0
    (monitor,) = [c for c in cli.trainer.callbacks if isinstance(c, EvaluationMonitor)]
    import my_evaluations

    assert isinstance(monitor.evaluation, my_evaluations.NearestNeighbourDistance)
    assert monitor.metric_names() == ["nn/nn_dist"]
    assert keys.collect(cli.trainer.callbacks).find("nn/nn_dist") is not None  # declared at setup

    # independent: the trained model's samples on the same seeds, nearest neighbours by numpy
    seeds = torch.arange(0, 64)
    x = cli.model.generate(seeds).flatten(1).double().numpy()
    train = cli.datamodule.train_data.flatten(1).double().numpy()
    dist = np.sqrt(((x[:, None, :] - train[None, :, :]) ** 2).sum(-1)).min(1)
    rows = [r for r in _csv_rows(root) if r.get("nn/nn_dist")]
    assert [int(r["epoch"]) for r in rows] == [0, 1]  # one value per epoch
    assert float(rows[-1]["nn/nn_dist"]) == pytest.approx(dist.mean(), rel=1e-9)
    assert [h["nn/nn_dist"] for h in monitor.history] == pytest.approx([float(r["nn/nn_dist"]) for r in rows],
                                                                      rel=1e-12)
    assert rows[0]["nn/nn_dist"] != rows[1]["nn/nn_dist"]  # measured again after training
    # the per-unit record of the last epoch: the 64 distances, the seeds as unit ids
    records, bad = read_records(root / "per_unit")
    assert not bad
    last = [r for r in records["nn/nn_dist"] if r.epoch == 1]
    assert len(last) == 1 and last[0].kind == "mean"
    np.testing.assert_allclose(last[0].values, dist, rtol=1e-9)
    assert np.array_equal(last[0].units, np.arange(64))
    assert value_and_se(last[0].values, "mean") == pytest.approx(
        (dist.mean(), dist.std(ddof=1) / math.sqrt(64)), rel=1e-9)


# ------------------------------------------------------------------ 7. an event detector
def _settled_oracle(x, y, window=5, band=0.05):
    """Brute force of the page's rule: the first index from which every later value is within
    band x |mean of the last window| of that mean."""
    end = sum(y[-window:]) / window
    for i in range(len(y)):
        if all(abs(v - end) <= band * abs(end) for v in y[i:]):
            return i if i < len(y) - window else None
    return None


def test_a_user_event_detector_from_one_file_and_one_config_block(ext, tmp_path):
    """Section 7: the config block's RegimeMonitor imports my_detectors (registering "settled"
    on pfd/e_gen); the analysis of the recorded quickstart's E_gen curve reports
    pfd_e_gen_settled at the brute-force epoch; ``report --detector-modules`` puts it in
    report.md, and without the option a fresh process says which module the run used and runs
    nothing of it. A bad module, a built-in name and a second function under the name are refused."""
    import json
    import subprocess

    from lightning_pfd.analysis import register_detector
    from lightning_pfd.analysis.events import analyze_history
    from lightning_pfd.analysis.report import save_detector_settings
    from lightning_pfd.callbacks import RegimeMonitor
    from lightning_pfd.commands.report import main as report_main

    block = yaml.safe_load(doc_blocks()["quickstart_settled.yaml"].split("\n", 1)[1])[0]
    mon = RegimeMonitor(verbose=False, **block["init_args"])
    assert mon.detector_modules == ["my_detectors"]
    rec = json.loads((Path(__file__).resolve().parents[1] / "experiments/results/quickstart_record.json").read_text())
    curve = rec["curves"]["E_gen"]["values"]
    x = np.array(sorted(map(int, curve)), dtype=float)
    y = np.array([curve[str(int(e))] for e in x])
    want = _settled_oracle(list(x), list(y))
    assert want is not None
    got = [e for e in analyze_history({"pfd/e_gen": (x, y)}).events if e.name == "pfd_e_gen_settled"]
    assert len(got) == 1 and got[0].epoch == x[want] and got[0].detail["detector"] == "settled"
    # a run on disk (CSV rows) with its settings naming the module
    run = tmp_path / "run"
    d = run / "lightning_logs" / "version_0"
    d.mkdir(parents=True)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "step", "pfd/e_gen"])
        for e, v in zip(x, y):
            w.writerow([int(e), int(e) * 10 + 9, repr(float(v))])
    save_detector_settings(d, mon.detector_settings, detector_modules=["my_detectors"])
    assert report_main([str(run), "--detector-modules", "my_detectors", "--out", str(tmp_path / "rep")]) == 0
    assert f"| pfd_e_gen_settled | {int(x[want])} |" in (tmp_path / "rep" / "report.md").read_text()
    env = {k: v for k, v in __import__("os").environ.items()}
    env["PYTHONPATH"] = __import__("os").pathsep.join([str(ext), str(Path(__file__).resolve().parents[1])])
    r = subprocess.run([sys.executable, "-m", "lightning_pfd", "report", str(run), "--out", str(tmp_path / "rep2")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the run's event detectors of my_detectors are not run: pass --detector-modules my_detectors" in r.stderr
    assert "pfd_e_gen_settled" not in (tmp_path / "rep2" / "report.md").read_text()
    with pytest.raises(ConfigError, match="detector_modules: 'json' registers no event detector"):
        RegimeMonitor(detector_modules=["json"])
    with pytest.raises(ConfigError, match="detector name: is a built-in detector"):
        register_detector("double_descent")(lambda *a, **k: None)
    with pytest.raises(ConfigError, match="already registered by my_detectors.detect_settled"):
        register_detector("settled")(lambda *a, **k: None)
