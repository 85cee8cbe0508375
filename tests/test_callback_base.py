"""The monitors' base (lightning_pfd/callbacks/base.py, figures.py) and the sharding convention.

Oracles: the global order of an evaluation set (rows reassembled from simulated ranks must equal
the rows themselves), the files a logger writes (PNG magic bytes, the W&B offline log read back),
Lightning's own state-key format.
"""
import json
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_pfd import keys
from lightning_pfd.callbacks.base import MeasurementCallback
from lightning_pfd.callbacks.figures import figure_to_array, log_figure
from lightning_pfd.evaluation import sharding
from lightning_pfd.evaluation.base import TorchDistributed, distributed_world
from wandb_wait import wait_for_exit_record

PNG = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- helpers
class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.lin(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)),
                                           batch_size=4)

    val_dataloader = train_dataloader


class Probe(MeasurementCallback):
    """Logs epoch² under ``<tag>/value`` and a figure under ``<tag>/figure``."""

    def __init__(self, tag="probe", threshold=0.5, batch_size=8, figure=False, **kw):
        super().__init__(**kw)
        self.tag, self.threshold, self.batch_size, self.figure = tag, threshold, batch_size, figure
        self.written = []

    def _state_key_args(self):
        return {"tag": self.tag, "threshold": self.threshold}  # batch_size is operational

    def metric_names(self):
        return [f"{self.tag}/value"]

    def _extra_state(self):
        return {"written": list(self.written)}

    def _load_extra_state(self, state):
        self.written = list(state.get("written", []))

    def _measure_and_log(self, trainer, pl_module):
        e = trainer.current_epoch
        self.log_metrics(trainer, pl_module, {f"{self.tag}/value": float(e) ** 2}, extra={"note": e})
        if self.figure:
            self.written.append(self.log_figure(trainer, f"{self.tag}/figure", _figure(e)))


def _figure(e):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([0, 1], [e, e + 1])
    return fig


def _trainer(tmp_path, callbacks, max_epochs=3, **kw):
    args = dict(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, default_root_dir=str(tmp_path), log_every_n_steps=1)
    args.update(kw)
    return pl.Trainer(callbacks=callbacks, **args)


def _fit(trainer, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few-batches / num_workers hints
        trainer.fit(Tiny(), **kw)


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 7, 12])
def test_shards_partition_the_set(n, world):
    parts = [sharding.shard_indices(n, r, world) for r in range(world)]
    allidx = torch.cat(parts)
    assert sorted(allidx.tolist()) == list(range(n))  # every item once, none twice
    sizes = [len(p) for p in parts]
    assert sizes == sharding.shard_sizes(n, world) and max(sizes) - min(sizes) <= 1
    for r, p in enumerate(parts):  # position r, r + world, ...
        assert all(int(i) % world == r for i in p)


def test_gather_shards_reassembles_global_order_world3():
    rows = torch.randn(11, 2, 3, dtype=torch.float64)
    world = 3
    per = sharding.shard_size(11, 0, world)
    parts = [sharding.pad_rows(sharding.shard(rows, r, world), per) for r in range(world)]
    assert all(p.shape[0] == per for p in parts)
    assert torch.equal(sharding.gather_shards(parts, 11, world), rows)
    # unpadded parts too
    exact = [rows[sharding.shard_indices(11, r, world)] for r in range(world)]
    assert torch.equal(sharding.gather_shards(exact, 11, world), rows)


def test_sharding_rejects_bad_input():
    with pytest.raises(ValueError, match="rank"):
        sharding.shard_indices(5, 3, 3)
    with pytest.raises(ValueError, match="n must"):
        sharding.shard_indices(-1, 0, 1)
    with pytest.raises(ValueError, match="parts"):
        sharding.gather_shards([torch.zeros(2)], 4, 2)
    with pytest.raises(ValueError, match="holds 1 rows"):
        sharding.gather_shards([torch.zeros(1), torch.zeros(2)], 4, 2)
    with pytest.raises(ValueError, match="cannot pad"):
        sharding.pad_rows(torch.zeros(3), 2)


def test_one_process_is_the_identity():
    x = torch.arange(5.0)
    assert distributed_world() == 1
    comm = TorchDistributed()
    assert (comm.rank, comm.world) == (0, 1)
    assert comm.gather_rows(x, 5) is x and comm.reduce_sum(x) is x


class _Strategy:
    """Simulates the collectives of a 3-process run, seen from one rank: all_gather stacks what
    every rank contributes (each rank's strided shard, padded as the base pads it)."""

    def __init__(self, data, rank, world, values=None):
        self.data, self.rank, self.world, self.values = data, rank, world, values
        self.root_device = torch.device("cpu")

    def _part(self, q):
        return self.data[q::self.world]

    def all_gather(self, t):
        if t.dtype == torch.long and t.numel() == 1:  # the row count
            return torch.stack([torch.tensor([len(self._part(q))]) for q in range(self.world)])
        assert torch.equal(t, sharding.pad_rows(self._part(self.rank), t.shape[0]))
        return torch.stack([sharding.pad_rows(self._part(q), t.shape[0]) for q in range(self.world)])

    def reduce(self, t, reduce_op="mean"):
        assert reduce_op == "sum" and t.dtype == torch.float64
        return torch.tensor([sum(self.values)], dtype=torch.float64)


class _Trainer:
    def __init__(self, rank, world, strategy):
        self.global_rank, self.world_size, self.strategy = rank, world, strategy


@pytest.mark.parametrize("n", [None, 10])
def test_callback_shard_and_gather_world3(n):
    data = torch.randn(10, 4)
    world = 3
    got = set()
    for rank in range(world):
        trainer = _Trainer(rank, world, _Strategy(data, rank, world))
        comm = MeasurementCallback.comm(trainer)
        idx = comm.shard(10)
        assert torch.equal(idx, torch.arange(rank, 10, world))
        got |= set(idx.tolist())
        rows = comm.shard(data)
        assert torch.equal(rows, data[idx])
        assert torch.equal(comm.gather_rows(rows, n), data)
    assert got == set(range(10))


def test_callback_reduce_sum_and_one_process():
    values = [1.0, 0.0, 2.5]
    trainer = _Trainer(1, 3, _Strategy(torch.zeros(3), 1, 3, values=values))
    comm = MeasurementCallback.comm(trainer)
    assert float(comm.reduce_sum(torch.tensor([values[1]], dtype=torch.float64))) == 3.5
    one = MeasurementCallback.comm(_Trainer(0, 1, None))
    four = torch.tensor([4.0], dtype=torch.float64)
    assert one.reduce_sum(four) is four and one.all_true(True) and not one.all_true(False)
    assert torch.equal(one.gather_rows(torch.ones(2)), torch.ones(2))


# ----------------------------------------------------------------------------- state
def test_state_key_from_distinguishing_args():
    a, b = Probe(tag="a"), Probe(tag="a", batch_size=64, every_n_epochs=3)
    assert a.state_key == b.state_key  # operational arguments do not enter
    assert Probe(tag="b").state_key != a.state_key
    assert Probe(tag="a", threshold=0.7).state_key != a.state_key
    # Lightning's format (the one of checkpoints written before the base existed)
    assert a.state_key == pl.Callback._generate_state_key(a, tag="a", threshold=0.5)
    assert a.state_key.startswith("Probe{")

    class Plain(MeasurementCallback):
        pass

    assert Plain().state_key == Plain.__qualname__  # Lightning's default


def test_state_dict_round_trip(tmp_path):
    mon = Probe(figure=True)
    _fit(_trainer(tmp_path, [mon], max_epochs=3))
    state = json.loads(json.dumps(mon.state_dict()))  # checkpoint-serialisable
    assert state["schedule"] == {"passes": 3}
    other = Probe(figure=True)
    other.load_state_dict(state)
    assert other.history == mon.history and other.written == mon.written
    assert other.schedule.passes == 3 and other.state_dict() == mon.state_dict()
    assert [h["epoch"] for h in mon.history] == [0, 1, 2]
    assert [h["probe/value"] for h in mon.history] == [0.0, 1.0, 4.0]
    assert [h["note"] for h in mon.history] == [0, 1, 2]


def test_log_metrics_reach_callback_metrics_and_csv(tmp_path):
    mon = Probe()
    logger = CSVLogger(str(tmp_path), name="csv")
    _fit(_trainer(tmp_path, [mon], max_epochs=3, logger=logger))
    trainer_metric = mon.history[-1]["probe/value"]
    assert trainer_metric == 4.0
    from lightning_pfd.analysis.history import load_history

    x, y = load_history(tmp_path / "csv").series("probe/value")
    np.testing.assert_array_equal(x, [0, 1, 2])
    np.testing.assert_array_equal(y, [0.0, 1.0, 4.0])


# ----------------------------------------------------------------------------- figures
def test_log_figure_writes_png_without_logger(tmp_path):
    import matplotlib.pyplot as plt

    mon = Probe(figure=True)
    _fit(_trainer(tmp_path, [mon], max_epochs=2))
    expect = [str(tmp_path / "figures" / f"probe_figure-epoch{e:04d}.png") for e in (0, 1)]
    assert mon.written == expect
    for p in expect:
        assert Path(p).read_bytes()[:8] == PNG
    assert plt.get_fignums() == []  # nothing left open


def test_log_figure_png_under_csv_log_dir_and_arrays(tmp_path):
    mon = Probe(figure=True)
    logger = CSVLogger(str(tmp_path), name="csv")
    trainer = _trainer(tmp_path, [mon], max_epochs=1, logger=logger)
    _fit(trainer)
    assert mon.written == [str(Path(logger.log_dir) / "figures" / "probe_figure-epoch0000.png")]
    # an image array (grey uint8, RGB float) goes through the same path
    import matplotlib.image as mpimg

    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    p = log_figure(trainer, "pfd/samples", grey)
    back = mpimg.imread(p)
    assert back.shape[:2] == (3, 4)
    assert Path(p).name == f"pfd_samples-epoch{trainer.current_epoch:04d}.png"  # after fit: 1
    np.testing.assert_allclose(back[..., 0], grey / 255.0, atol=1 / 255)
    rgb = torch.rand(5, 6, 3)
    assert figure_to_array(rgb).shape == (5, 6, 3)


def test_log_figure_offline_wandb_image_and_user_key_summary(tmp_path):
    """One offline W&B run: a MeasurementCallback logs a user metric and a figure; the run read
    back from disk has the image, the metric's history and the summary its key declares (max)."""
    import wandb

    from lightning_pfd.analysis.history import load_history, read_wandb_records
    from lightning_pfd.callbacks.progress import PFDProgressBar
    from lightning_pfd.callbacks.wandb_setup import AutoWandbLogger

    user = keys.MetricKey("probe/value", "PROBE", lower_is_better=False, progress_bar=True)

    class DeclaringProbe(Probe):
        def metric_keys(self):
            return [user]

    mon = DeclaringProbe(figure=True)
    bar = PFDProgressBar()
    logger = AutoWandbLogger(project="pfd-test", save_dir=str(tmp_path))
    assert logger._offline is True
    trainer = _trainer(tmp_path, [mon, bar], max_epochs=3, logger=logger,
                       enable_progress_bar=True)
    _fit(trainer)
    assert bar.get_metrics(trainer, trainer.lightning_module)["PROBE"] == "4"
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    wait_for_exit_record(run_dir)
    assert mon.written == [None, None, None]  # W&B took the images: no PNG written
    assert not (tmp_path / "figures").exists()
    h = load_history(run_dir, use_leet=False)
    assert len(h.images["probe/figure"]) == 3
    assert Path(h.images["probe/figure"][0]).read_bytes()[:8] == PNG
    x, y = h.series("probe/value")
    np.testing.assert_array_equal(y, [0.0, 1.0, 4.0])
    assert h.summary["probe/value"]["max"] == 4.0  # summary from lower_is_better=False
    recs, _, _ = read_wandb_records(h.path, use_leet=True)  # as tests/test_wandb.py
    metric = {r.get("name"): r for kind, r in recs if kind == "metric"}
    assert metric["probe/value"]["step_metric"] == "epoch"
    assert keys.find("probe/value") is None  # declared by the run's callback, not built in


def test_log_figure_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mon = Probe(figure=True)
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    _fit(_trainer(tmp_path, [mon], max_epochs=2, logger=logger))
    assert mon.written == [None, None]
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    assert "probe/figure" in acc.Tags()["images"]
    assert len(acc.Images("probe/figure")) == 2


def test_log_figure_closes_on_other_ranks(tmp_path):
    import matplotlib.pyplot as plt

    class Rank1:
        is_global_zero = False

    fig = plt.figure()
    assert log_figure(Rank1(), "x/y", fig) is None
    assert not plt.fignum_exists(fig.number)


_GLOO_WORKER = """
import sys
import torch
import torch.distributed as dist
from lightning_pfd.evaluation import sharding
from lightning_pfd.evaluation.base import TorchDistributed, distributed_world

rank, world, init_file, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
rows = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)  # the same on every rank
mine = rows[sharding.shard_indices(n, rank, world)]
comm = TorchDistributed()
full = comm.gather_rows(mine, n)
unknown_n = comm.gather_rows(mine)  # the row count gathered too
total = float(comm.reduce_sum(torch.tensor([float(mine.sum())], dtype=torch.float64)))
torch.save({"full": full, "unknown_n": unknown_n, "total": total, "rank": comm.rank,
            "world": distributed_world()}, out)
dist.destroy_process_group()
"""


def test_torch_distributed_comm_in_a_real_3_process_group(tmp_path):
    """torch.distributed (gloo, 3 CPU processes running only torch + the Comm): every rank gets
    all rows in the global order and the global sum (oracle: the rows, built on every rank)."""
    import os
    import subprocess
    import sys

    n, world = 8, 3  # uneven shards: 3, 3, 2 rows
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _GLOO_WORKER, str(r), str(world),
                               str(tmp_path / "init"), str(n), str(tmp_path / f"rank{r}.pt")],
                              env=env, cwd=str(Path(__file__).resolve().parents[1]))
             for r in range(world)]
    assert [p.wait(timeout=600) for p in procs] == [0] * world
    rows = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)
    for r in range(world):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert got["world"] == world and got["rank"] == r
        assert torch.equal(got["full"], rows) and torch.equal(got["unknown_n"], rows)
        assert got["total"] == float(rows.sum())
