"""ICREarlyStopping's rise test: whole-run false stops on flat ICRs (vs the previous rule), a stop
after the minimum of a U-shape, undecided on zero or undefined noise, the Trainer integration
equal to the pure rule, exact resume, and the multi-process decision path."""
import math
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_pfd.analysis.early_stop import PatienceRule, rise_test
from lightning_pfd.callbacks import ICREarlyStopping
from scripted_icr import ScriptedICR, TinyModule, previous_rule

G = 16
SE = 0.01


def _run(n, seed, mu=None, common_sd=0.0):
    """ICRMonitor-format run: values (n,) and delete-a-group replicates (n, G); group noise with
    standard error SE, fixed group effects, optional white training noise common to all groups."""
    rng = np.random.default_rng(seed)
    mu = np.full(n, 0.35) if mu is None else np.asarray(mu, float)
    x = mu[:, None] + 0.05 * rng.standard_normal(G)[None, :] + SE * math.sqrt(G) * rng.standard_normal((n, G))
    eta = common_sd * rng.standard_normal(n)
    tot = x.sum(1)
    y = (tot / G + eta).astype(np.float32).astype(np.float64)  # as logged (float32)
    return y, (tot[:, None] - x) / (G - 1) + eta[:, None]


def _u(n, t_min, rise):
    t = np.arange(n, dtype=float)
    return 0.35 + 0.1 * np.clip((t_min - t) / t_min, 0, None) + rise * np.clip((t - t_min) / (n - 1 - t_min), 0, None)


def _pure_stop(y, reps, z=3.0, patience=5, horizon=None, window=3):
    """The stop index of the pure rule (patience and the rise test), as the callback applies it."""
    rule = PatienceRule("icr/icr", "min", 0.0, patience, check_finite=False)
    zs = []
    for i in range(y.size):
        stop, reason, _ = rule.update(y[i])
        t = rise_test(y[:i + 1], reps[:i + 1], horizon=horizon or y.size, window=window, min_z=z)
        if t.tested:
            zs.append(t.z)
        if stop and reason == "PATIENCE_EXHAUSTED" and t.significant(z):
            return i, zs
    return None, zs


def _any_block_end_significant(y, reps, z, window=3):
    """Whether the rise test reaches z at any block end (patience only removes stops)."""
    return any(rise_test(y[:n], reps[:n], horizon=y.size, window=window, min_z=z).significant(z)
               for n in range(2 * window, y.size + 1, window))


def test_flat_icr_rarely_stops_where_the_previous_rule_almost_always_did():
    """20 flat ICRs (40 checks, white group noise), both rules at z = 2.5: the rise test stops at
    most 1 (nominal whole-run rate 0.6 %); the previous rule (the selected minimum re-tested at
    every check) fails the same bound by far."""
    runs = [_run(40, s) for s in range(20)]
    old = sum(previous_rule(y, r, 2.5) is not None for y, r in runs)
    new = sum(_any_block_end_significant(y, r, 2.5) for y, r in runs)
    assert new <= 1, new
    assert old >= 7, old  # the same bound, applied to the previous rule, fails


def test_u_shaped_icr_stops_after_its_minimum():
    """Minimum at check 12, then a rise of 0.15 (15 standard errors) over 27 checks: the rule stops,
    after the minimum; the previous rule's selected minimum is not needed."""
    y, reps = _run(40, 7, mu=_u(40, 12, 0.15))
    stop, zs = _pure_stop(y, reps)
    assert stop is not None and 12 < stop < 40, (stop, zs)
    t = rise_test(y[:stop + 1], reps[:stop + 1], horizon=40, min_z=3.0)
    assert t.minimum[0] <= 12 + 3 and t.z >= 3.0 and math.isfinite(t.z)


def test_training_noise_bound_is_never_zero_where_the_curve_moves():
    """Group noise only, 12 checks: the mean excess of the second differences over their jackknife
    variance is negative in some runs, yet the upper bound (mean floored at 0, plus two standard
    errors) and every fitted tau2 stay positive; a slow smooth training noise the short run cannot
    see is therefore never modelled as none."""
    from lightning_pfd.analysis.early_stop import fit_training_noise

    negative = 0
    for seed in range(20):
        y, reps = _run(12, seed)
        d = y[2:] - 2 * y[1:-1] + y[:-2]
        dr = reps[2:] - 2 * reps[1:-1] + reps[:-2]
        v = (G - 1) / G * ((dr - dr.mean(1, keepdims=True)) ** 2).sum(1)
        negative += (d ** 2 - v).mean() < 0
        lags, excess, tau2, phis = fit_training_noise(y, reps)
        assert np.all(excess > 0) and np.all(tau2 > 0)
    assert negative >= 3  # the unfloored estimate would have been clipped to 0 in these runs


def test_zero_or_undefined_noise_is_undecided_never_infinite():
    n = 24
    y = np.full(n, 0.3)
    y[-3:] = 0.4  # a rise, but no noise at all: no z can be given
    reps = np.repeat(y[:, None], G, 1)
    t = rise_test(y, reps, horizon=n)
    assert t.tested and not t.decided and math.isnan(t.z) and "zero" in t.reason
    assert not t.significant(0.0)
    y2, r2 = _run(n, 1)
    y2[5] = float("nan")
    assert "non-finite" in rise_test(y2, r2, horizon=n).reason
    y3, r3 = _run(n, 2)
    assert "too few" in rise_test(y3[:6], r3[:6], horizon=n).reason  # 6 checks: no second differences
    assert "no jackknife" in rise_test(y3[:12], None, horizon=n).reason
    assert not rise_test(y3[:7], r3[:7], horizon=n).tested  # 7 is not a block end


def test_undecided_rise_never_stops_and_says_why(tmp_path):
    """A scripted ICR without per-unit records: patience runs out, the rise test is undecided, the
    run goes on (one warning naming the reason); min_rise_z=None is plain patience."""
    curve = [0.9, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]
    es = ICREarlyStopping(patience=2)
    with pytest.warns(RuntimeWarning, match="no jackknife replicates"):
        _trainer(tmp_path, [ScriptedICR(np.array(curve), None), es], len(curve)).fit(TinyModule())
    assert es.stopped_epoch == 0 and es.wait_count == 7 and math.isnan(es.rise_z)
    plain = ICREarlyStopping(patience=2, min_rise_z=None)
    _trainer(tmp_path / "p", [ScriptedICR(np.array(curve), None), plain], len(curve)).fit(TinyModule())
    assert plain.stopped_epoch == 3
    with pytest.raises(ValueError, match="min_rise_z"):
        ICREarlyStopping(min_rise_z=-1)
    with pytest.raises(ValueError, match="rise_window"):
        ICREarlyStopping(rise_window=0)


# ----------------------------------------------------------------------------- the Trainer
def _trainer(root, callbacks, max_epochs):
    return pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, default_root_dir=root,
                      enable_progress_bar=False, enable_model_summary=False, limit_train_batches=1,
                      limit_val_batches=1, num_sanity_val_steps=0, accelerator="cpu", devices=1,
                      enable_checkpointing=False)


@pytest.fixture(scope="module")
def u_run():
    y, reps = _run(30, 3, mu=_u(30, 9, 0.2))
    stop, zs = _pure_stop(y, reps)
    assert stop is not None and stop > 9
    return y, reps, stop, zs


def test_trainer_integration_equals_the_pure_rule(tmp_path, u_run):
    y, reps, stop, zs = u_run
    es = ICREarlyStopping(patience=5)
    _trainer(tmp_path, [ScriptedICR(y, reps), es], y.size).fit(TinyModule())
    assert es.stopped_epoch == stop and es.stopping_reason.name == "PATIENCE_EXHAUSTED"
    assert es.rise_z == pytest.approx(zs[-1]) and es.rise_z >= 3.0
    assert "whole-run z" in es.stopping_reason_message


def test_resume_mid_run_takes_the_same_decision(tmp_path, u_run):
    y, reps, stop, zs = u_run
    first = ICREarlyStopping(patience=5)
    last = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True, save_top_k=0)
    trainer = pl.Trainer(max_epochs=stop - 2, callbacks=[ScriptedICR(y, reps), first, last], logger=False,
                         default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                         limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0, accelerator="cpu")
    trainer.fit(TinyModule())
    assert first.stopped_epoch == 0 and len(first.series_values) == stop - 2
    second = ICREarlyStopping(patience=5)
    trainer2 = _trainer(tmp_path, [ScriptedICR(y, reps), second], y.size)
    trainer2.fit(TinyModule(), ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert second.stopped_epoch == stop and second.rise_z == pytest.approx(zs[-1])
    assert second.series_values[:stop - 2] == first.series_values
    again = ICREarlyStopping(patience=5)
    again.load_state_dict(second.state_dict())
    assert again.state_dict() == second.state_dict()


def _fake_trainer(tmp_path, value, reduce):
    from lightning.pytorch.trainer.states import TrainerFn

    state = SimpleNamespace(fn=TrainerFn.FITTING)
    return SimpleNamespace(callback_metrics={"icr/icr": torch.tensor(value)}, current_epoch=0, global_step=0,
                           is_global_zero=False, fast_dev_run=False, should_stop=False, loggers=[],
                           world_size=2, global_rank=1, default_root_dir=str(tmp_path), ckpt_path=None,
                           state=state, sanity_checking=False,
                           strategy=SimpleNamespace(reduce_boolean_decision=reduce))


def test_the_decision_goes_through_the_strategys_reduction(tmp_path):
    """Every rank's decision is reduced with reduce_boolean_decision(all=False) (Lightning's rule:
    one rank stopping stops all), also for ranks that cannot run the rise test."""
    calls = []

    def any_rank_stops(decision, all=True):
        calls.append((decision, all))
        return True  # rank 0 decided to stop

    es = ICREarlyStopping(patience=1)
    trainer = _fake_trainer(tmp_path, 0.5, any_rank_stops)
    es.run_check(trainer)
    assert calls == [(False, False)] and trainer.should_stop and es.stopped_epoch == 0
    calls.clear()
    es2 = ICREarlyStopping(patience=1, dry_run=True)
    trainer2 = _fake_trainer(tmp_path, 0.5, any_rank_stops)
    es2.run_check(trainer2)
    assert calls == [(False, False)] and not trainer2.should_stop and es2.would_stop_epoch == 0


def test_a_resume_applies_the_configured_patience_unlike_lightnings_early_stopping():
    """Issue 40 item 9, decided and documented: the configured ``patience`` applies on resume (the
    wait count is kept); Lightning's EarlyStopping replaces it by the checkpoint's. The state key
    is this class's own, so Lightning's EarlyStopping entry is not this rule's."""
    from lightning.pytorch.callbacks import EarlyStopping

    from lightning_pfd.callbacks import ICREarlyStopping

    a = ICREarlyStopping(patience=3, min_rise_z=None)
    a._rule.load_state_dict({"best": 0.5, "wait_count": 2})
    state = a.state_dict()
    b = ICREarlyStopping(patience=7, min_rise_z=None)
    b.load_state_dict(state)
    assert b.patience == 7 and b._rule.wait_count == 2 and b._rule.best == 0.5
    assert b._rule.patience == 7  # the rule that decides uses it
    lit = EarlyStopping(monitor="icr/icr", patience=7)
    lit.load_state_dict({"wait_count": 2, "stopped_epoch": 0, "best_score": torch.tensor(0.5), "patience": 3})
    assert lit.patience == 3  # Lightning's choice (the oracle of the difference)
    assert b.state_key != EarlyStopping(monitor="icr/icr", mode="min").state_key
