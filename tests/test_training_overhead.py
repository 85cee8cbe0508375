"""The cheap training step is the straightforward one, bit for bit.

Oracles: ``EMA.update`` and ``torch.manual_seed`` themselves, brute-force per-tensor norms, a
DataLoader that collates single samples of a plain ``TensorDataset``, and a module written the
straightforward way (re-seed with ``torch.manual_seed``, walk ``parameters()`` every step, check
then always sanitise, ``ema_step``, ``self.log`` every step) trained side by side.
"""
from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_pfd.data.base import (BatchedTensorDataset, SeededPermutationSampler, SeededReplacementSampler,
                                     TensorDataModule)
from lightning_pfd.modules import EMA, DiffusionModule, LevyItoModule, ema_beta
from lightning_pfd.modules.base import StepLists, grads_finite, seed_step, step_seed
from lightning_pfd.modules.ema import ema_step, sanitize_gradients
from lightning_pfd.nets import MLPNet


# -- seeding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2**62 + 12345])
def test_seed_step_leaves_the_cpu_generator_as_manual_seed_does(seed):
    torch.manual_seed(seed)
    want_state, want = torch.get_rng_state(), torch.randn(5)
    torch.manual_seed(seed + 1)  # something else first
    seed_step(seed, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), want_state)
    assert torch.equal(torch.randn(5), want)


# -- gradient finiteness -----------------------------------------------------------------------------
def _brute_force_finite(grads):
    return all(math.isfinite(float(torch.linalg.vector_norm(g))) for g in grads)


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [0, 2])
def test_grads_finite_is_every_norm_finite(bad, where):
    g = torch.Generator().manual_seed(where)
    grads = [torch.randn(7, 3, generator=g), torch.randn(5, generator=g), torch.randn(2, 2, 2, generator=g)]
    if bad is not None:
        grads[where].view(-1)[3] = bad
    assert bool(grads_finite(grads)) is (bad is None) is _brute_force_finite(grads)
    assert grads_finite([]) is None


def test_grads_finite_keeps_the_norm_semantics_for_huge_finite_gradients():
    """The check has always been "every 2-norm finite": a finite gradient whose float32 norm
    overflows counts as non-finite (it stays the same check, only cheaper)."""
    grads = [torch.full((4,), 1e20), torch.ones(3)]
    assert all(bool(torch.isfinite(x).all()) for x in grads)
    assert not bool(grads_finite(grads))
    assert bool(grads_finite([torch.full((4,), 1e18), torch.ones(3)]))


# -- EMA with the lists built once --------------------------------------------------------------------
class _WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)  # running stats: buffers the EMA copies

    def forward(self, x):
        return self.norm(self.lin(x))


def _perturb(model, step):
    with torch.no_grad():
        g = torch.Generator().manual_seed(100 + step)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
        for b in model.buffers():
            if b.is_floating_point():
                b.add_(torch.rand(b.shape, generator=g))


def test_step_lists_ema_update_is_ema_update_bit_for_bit():
    torch.manual_seed(0)
    live = _WithBuffer()
    ref_ema, ema = EMA(live), EMA(live)
    lists = StepLists(ema, live)
    for step in range(6):
        _perturb(live, step)
        beta = ema_beta(step, 64, 0.999, halflife_kimg=None if step % 2 else 0.5)
        ref_ema.update(live, beta)
        assert lists.num_updates() == step
        lists.ema_update(beta)
        for a, b in zip(ref_ema.state_dict().values(), ema.state_dict().values()):
            assert torch.equal(a, b)
    assert int(ema.num_updates) == 6 and lists.num_updates() == 6
    # and it is the convex blend: shadow <- beta * shadow + (1 - beta) * live
    before = ema.shadow.lin.weight.clone()
    lists.ema_update(0.75)
    torch.testing.assert_close(ema.shadow.lin.weight, 0.75 * before + 0.25 * live.lin.weight)
    with pytest.raises(ValueError, match="must lie in"):
        lists.ema_update(1.5)


def test_num_updates_follows_writes_from_elsewhere():
    live = torch.nn.Linear(3, 2)
    ema = EMA(live)
    lists = StepLists(ema, live)
    lists.ema_update(0.5)
    ema.update(live, 0.5)  # the slow path moves the counter: the host copy notices
    assert lists.num_updates() == 2
    ema.load_state_dict({**ema.state_dict(), "num_updates": torch.tensor(41)})
    assert lists.num_updates() == 41
    ema.num_updates = torch.tensor(7)  # a new tensor
    assert lists.num_updates() == 7


def test_step_lists_are_rebuilt_when_parameters_are_replaced():
    torch.manual_seed(0)
    model = DiffusionModule(MLPNet(4, hidden=8, depth=1))
    first = model.step_lists()
    assert model.step_lists() is first
    # assign=True puts new parameter objects in place: the lists must follow them
    new_state = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    model.load_state_dict(new_state, assign=True)
    lists = model.step_lists()
    assert lists is not first
    live = list(model.trained_module.parameters())
    assert not any(a is b for a, b in zip(first.params, live))
    assert all(a is b for a, b in zip(lists.params, live)) and len(lists.params) == len(live)
    # a dtype conversion (through _apply) rebuilds them too, and the update still matches EMA.update
    model = model.to(torch.float64)
    ref = copy.deepcopy(model.ema)
    model.step_lists().ema_update(0.9)
    ref.update(model.trained_module, 0.9)
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), model.ema.state_dict().values()))


def test_a_copy_gets_its_own_lists():
    model = DiffusionModule(MLPNet(4, hidden=8, depth=1))
    model.step_lists()
    twin = copy.deepcopy(model)
    lists = twin.step_lists()
    assert all(a is b for a, b in zip(lists.params, twin.trained_module.parameters()))
    assert not any(a is b for a, b in zip(lists.params, model.trained_module.parameters()))


# -- batches by one tensor index ----------------------------------------------------------------------
def _collated_batches(loader_kw, x, y, sampler):
    ref = DataLoader(TensorDataset(x, y), sampler=sampler, **loader_kw)  # per-sample default collate
    return list(ref)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("samples_per_epoch", [None, 70])
@pytest.mark.parametrize("labels", [False, True])
def test_batches_equal_the_per_sample_collate(seed, samples_per_epoch, labels):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(45, 2, 3, generator=g) * 2 - 1
    y = torch.randint(0, 10, (45,), generator=g) if labels else None
    dm = TensorDataModule(train_data=x, train_labels=y, val_data=x[:11], val_labels=None if y is None else y[:11],
                          batch_size=8, val_batch_size=4, samples_per_epoch=samples_per_epoch, seed=seed)
    dm.setup("fit")
    y_full = y if y is not None else torch.full((45,), -1, dtype=torch.long)
    for epoch in (0, 1, 5):
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        sampler = (SeededReplacementSampler(45, samples_per_epoch, seed=seed) if samples_per_epoch
                   else SeededPermutationSampler(45, seed=seed))
        sampler.set_epoch(epoch)
        want = _collated_batches(dict(batch_size=8), x, y_full, sampler)
        got = list(loader)
        assert len(got) == len(want) == math.ceil(len(sampler) / 8)
        for a, b in zip(got, want):
            assert type(a) is type(b) is list and len(a) == len(b) == 2
            for ta, tb in zip(a, b):
                assert ta.dtype == tb.dtype and ta.shape == tb.shape and ta.is_contiguous()
                assert torch.equal(ta, tb)
    val, want = list(dm.val_dataloader()), list(DataLoader(TensorDataset(x[:11], y_full[:11]), batch_size=4))
    assert len(val) == len(want) == 3
    assert all(torch.equal(a, b) for va, vb in zip(val, want) for a, b in zip(va, vb))


def test_batched_dataset_keeps_single_samples_and_works_in_a_worker():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    ds = BatchedTensorDataset(x, y)
    assert isinstance(ds, TensorDataset)
    assert all(torch.equal(a, b) for a, b in zip(ds[4], (x[4], y[4])))
    dm = TensorDataModule(train_data=x, train_labels=y, batch_size=4, num_workers=1, value_range=None)
    got = list(dm.train_dataloader())
    order = list(SeededPermutationSampler(6, seed=0))
    assert torch.equal(torch.cat([b[1] for b in got]), torch.tensor(order))
    assert torch.equal(torch.cat([b[0] for b in got]), x[order])


# -- a whole fit against the straightforward module ------------------------------------------------
class _Straightforward:
    """The per-step hooks written the plain way (what the cheap ones must reproduce)."""

    def on_train_batch_start(self, batch, batch_idx):
        torch.manual_seed(step_seed(self.train_seed, self.trainer.fit_loop.epoch_loop.total_batch_idx,
                                    self.global_rank))

    def on_before_optimizer_step(self, optimizer):
        patience = int(self.hparams.divergence_patience)
        if patience > 0:
            grads = [p.grad for p in self.trained_module.parameters() if p.grad is not None]
            finite = torch.stack([torch.linalg.vector_norm(g) for g in grads]).isfinite().all()
            if self.trainer.world_size <= 1 and self._last_loss is not None:
                finite = finite & self._last_loss.isfinite().all()
            self._bad_steps = 0 if bool(finite) else self._bad_steps + 1
            if self._bad_steps >= patience and not self.diverged:
                self._on_diverged()
        params = sanitize_gradients(self.trained_module.parameters())
        clip = self.hparams.get("gradient_clip_val")
        if clip:
            torch.nn.utils.clip_grad_norm_(params, float(clip))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        ema_step(self.ema, self.trained_module, self.hparams, self._images(batch).shape[0], self.trainer.world_size)


class _PlainDiffusion(_Straightforward, DiffusionModule):
    pass


class _PlainLevy(_Straightforward, LevyItoModule):
    pass


class _PlainData(TensorDataModule):
    """Loaders over a plain TensorDataset with the default per-sample collate."""

    def train_dataloader(self):
        loader = super().train_dataloader()
        return DataLoader(TensorDataset(*loader.dataset.tensors), batch_size=loader.batch_size,
                          sampler=loader.sampler, generator=loader.generator)

    def val_dataloader(self):
        loader = super().val_dataloader()
        return DataLoader(TensorDataset(*loader.dataset.tensors), batch_size=loader.batch_size,
                          generator=loader.generator)


class _PoisonGrads(Callback):
    """NaN / +inf / -inf gradients at some optimizer steps (sanitised, counted as bad steps)."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step in self.steps:
            grads = [p.grad for p in pl_module.trained_module.parameters() if p.grad is not None]
            grads[0].view(-1)[0] = float("nan")
            grads[1].view(-1)[0] = float("inf")
            grads[-1].view(-1)[-1] = -float("inf")


class _Record(Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append((dict(trainer.callback_metrics), dict(trainer.progress_bar_metrics),
                          pl_module.unhealthy, pl_module.diverged, [t.clone() for t in batch]))


def _fit(module_cls, data_cls, tmp: Path, poison=(), log_every_n_steps=2, **module_kw):
    pl.seed_everything(4, verbose=False)
    x = torch.rand(40, 6, generator=torch.Generator().manual_seed(1)) * 2 - 1
    dm = data_cls(train_data=x, val_data=x[:10], batch_size=8, val_batch_size=4, samples_per_epoch=24, seed=2)
    model = module_cls(MLPNet(6, hidden=16, depth=1, dropout=0.1), **module_kw)
    rec = _Record()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=4, logger=CSVLogger(tmp, name="csv"),
                         log_every_n_steps=log_every_n_steps, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[rec, _PoisonGrads(poison)], default_root_dir=tmp)
    trainer.fit(model, datamodule=dm)
    with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as f:
        table = list(csv.reader(f))
    opt = trainer.optimizers[0].state_dict()["state"]
    return model, rec.rows, table, opt


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) \
            and torch.equal(a.isnan(), b.isnan())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("case", ["edm_poisoned", "levy_clipped"])
def test_fit_is_bit_identical_to_the_straightforward_module(tmp_path, case):
    if case == "edm_poisoned":  # steps 3 and 5-7 non-finite: one bad step, then a divergence event
        cls, plain_cls, kw = DiffusionModule, _PlainDiffusion, dict(divergence_patience=3, on_divergence="continue",
                                                                      warmup_steps=3, ema_halflife_kimg=0.05)
        poison = (3, 5, 6, 7)
    else:  # three values logged per step, the gradient clip
        cls, plain_cls, kw, poison = LevyItoModule, _PlainLevy, dict(alpha=1.7, gradient_clip_val=0.5), (4,)
    model, rows, table, opt = _fit(cls, TensorDataModule, tmp_path / "fast", poison, **kw)
    ref, ref_rows, ref_table, ref_opt = _fit(plain_cls, _PlainData, tmp_path / "plain", poison, **kw)
    assert len(rows) == len(ref_rows) == 12
    assert _equal(model.state_dict(), ref.state_dict())
    assert _equal(opt, ref_opt)
    assert _equal(rows, ref_rows)  # callback and progress-bar metrics, health, batches: every step
    assert table == ref_table  # every logged value, in the same rows
    if case == "edm_poisoned":
        assert model.diverged and [r[2] for r in rows][:9] == [False] * 3 + [True] + [False] + [True] * 4


def test_epoch_means_are_logged_at_the_step_of_the_epochs_last_step(tmp_path):
    """``train/loss_epoch`` (written by the module itself, before the epoch's checkpoint) lands in
    the row of the step at which Lightning logged the epoch's last per-step value; its value is
    the float64 mean of the epoch's per-step losses."""
    _, rows, table, _ = _fit(DiffusionModule, TensorDataModule, tmp_path, log_every_n_steps=1)
    header, body = table[0], table[1:]
    col = {k: header.index(k) for k in ("step", "epoch", "train/loss", "train/loss_epoch")}
    per_step = [r for r in body if r[col["train/loss"]]]
    epoch_rows = [r for r in body if r[col["train/loss_epoch"]]]
    assert len(per_step) == 12 and len(epoch_rows) == 4  # 4 epochs of 3 steps
    for e, row in enumerate(epoch_rows):
        steps = [r for r in per_step if int(float(r[col["epoch"]])) == e]
        assert len(steps) == 3
        assert row[col["step"]] == steps[-1][col["step"]]
        mean = math.fsum(float(r[col["train/loss"]]) for r in steps) / 3
        assert float(row[col["train/loss_epoch"]]) == pytest.approx(mean, rel=1e-6)
