"""What every lightning_pfd LightningModule needs to survive a long run (Lightning glue).

:class:`EMAModule` is the base of ``DiffusionModule`` and ``LevyItoModule``: one trained network
with an EMA copy used for every evaluation, Adam with a linear warm-up, EDM's gradient guard, the
model <-> data shape check and the training / frozen-noise validation steps. It extends
:class:`ResumableModule`:

* **Training randomness is a pure function of (seed, batch counter, rank).** Before every
  training batch the global torch RNG is re-seeded with SplitMix64(seed, total batch index, rank),
  so the loss noise, the σ draws and dropout of batch k are the same whether the run was
  interrupted or not. The batch counter is part of Lightning's loop state in every checkpoint, the
  seed (``seed``, else ``seed_everything``'s, else 0) is stored in it too: a run resumed from
  ``last.ckpt`` continues bit-identically on CPU.
* **Divergence is an event.** ``divergence_patience`` consecutive bad steps — a non-finite loss
  or gradient, or a finite loss above ``divergence_factor`` times its lowest running mean — or,
  at an epoch's end, weights that are not finite or whose norm grew ``divergence_factor``-fold,
  or a monitor that finds the model's outputs collapsed (:meth:`ResumableModule.declare_diverged`)
  set ``self.diverged`` and ``diverged_reason``, log ``events/diverged_step`` /
  ``events/diverged_epoch`` / ``events/diverged_cause`` (1 + index in :data:`DIVERGENCE_CAUSES`),
  print one line and stop training (``on_divergence="stop"``) or carry on (``"continue"``).
  :class:`~lightning_pfd.callbacks.EpochCheckpoint` writes no checkpoint once diverged, so the last
  good one stays.
* **Epoch means are logged before the epoch's checkpoint** (``train/loss_epoch`` and friends,
  float64 sums reduced over ranks), so the on-disk history and the checkpoint agree.
* **The validation loss is world-size invariant.** Frozen noise is seeded by the sample's global
  index in the validation set and padded duplicates of a distributed sampler are dropped; the
  epoch value is a float64 sum / count over all ranks.
* **A step costs little beyond the plain loop's work.** The tensor lists a step touches (trained
  parameters, EMA pairs) are gathered once (:class:`StepLists`); the gradients' finiteness is one
  fused reduction and one host sync, and EDM's NaN/inf sanitation runs only when it finds a
  non-finite gradient. Per-step values go through ``self.log`` (Lightning's public API; its cost
  is Lightning's floor). The weights, the logged values and the checkpoints are bit-identical to
  the straightforward implementation (tests/test_training_overhead.py).
* **Resuming with other hyper-parameters is explicit.** A checkpoint whose architecture or
  diffusion family (``ARCHITECTURE_KEYS``) differs is refused with the list of conflicts; other
  differences (learning rate, EMA, schedule, ...) are applied and printed — the optimizer state's
  learning rate is replaced by the new one.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Dict, Iterable, List, Literal, Optional, Tuple, get_args

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ..checkpoint import verified_stream
from ..contracts import check_data_shape
from ..errors import ConfigError
from ..evaluation.base import strategy_comm
from .ema import EMA, ema_beta, sanitize_gradients
from .optim import apply_optimizer_hparams, configure_optimization, optimizer_class_changes

__all__ = ["ResumableModule", "EMAModule", "StepLists", "step_seed", "seed_step", "grads_finite",
           "compare_hparams", "check_training_args", "check_optimization", "record_optimization",
           "limit_cpu_threads", "OnDivergence",
           "DIVERGENCE_ACTIONS", "DIVERGENCE_FACTOR", "DIVERGENCE_CAUSES"]

#: a finite loss above this many times its lowest running mean, or weights whose norm grew this
#: many times over the start of training, diverged too (``divergence_factor``; 0: not checked)
DIVERGENCE_FACTOR = 1e4
#: the running mean of the step loss an explosion is measured against: its rate, and the steps
#: before its minimum is taken (the first steps' loss falls fast)
LOSS_EMA_RATE = 0.05
LOSS_WARMUP_STEPS = 20
#: what made a run diverge, logged as ``events/diverged_cause`` = index + 1
DIVERGENCE_CAUSES = ("nonfinite", "loss", "weights", "collapse")
#: what a module does once it diverged: stop training, or carry on
OnDivergence = Literal["stop", "continue"]
DIVERGENCE_ACTIONS = get_args(OnDivergence)
_MASK64 = (1 << 64) - 1
VAL_SEED_OFFSET = 10_000_000  # frozen-noise validation seeds: offset + global sample index


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, batch_index: int, rank: int = 0) -> int:
    """The torch seed of one training batch: SplitMix64 chained over (seed, batch, rank), 63 bits."""
    x = 0
    for v in (int(seed), int(batch_index), int(rank)):
        x = _splitmix64(x ^ (v & _MASK64))
    return x >> 1


def seed_step(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` before one training batch, at a fraction of its cost on CPU.

    ``torch.manual_seed`` also seeds every accelerator backend; while CUDA is not initialized it
    queues that seed lazily, formatting stack traces each time (docs/performance.md). A run on
    the CPU draws its training noise from the CPU generator only, so while no CUDA context exists
    that generator alone is seeded (the same state); any other device gets ``torch.manual_seed``."""
    if device.type == "cpu" and not torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def grads_finite(grads: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """0-d bool tensor: every gradient's 2-norm is finite (one fused ``_foreach_norm``, no host
    sync); None without gradients. A NaN or inf entry makes its norm non-finite."""
    if not grads:
        return None
    return torch.stack(torch._foreach_norm(grads)).isfinite().all()


def _plain(v):
    """Hyper-parameter value -> comparable plain Python (namespaces and tuples to dicts/lists)."""
    if hasattr(v, "as_dict"):
        v = v.as_dict()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items() if not str(k).startswith("_")}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _diff(a, b, prefix: str) -> List[Tuple[str, object, object]]:
    """Leaf differences between two nested plain values: (dotted key, a, b)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12):
        return []
    return [] if a == b else [(prefix, a, b)]


def compare_hparams(saved: dict, current: dict, architecture: Iterable[str]
                    ) -> Tuple[List[Tuple[str, object, object]], List[Tuple[str, object, object]]]:
    """Split the differences between a checkpoint's and the current hyper-parameters.

    Returns ``(refused, applied)``: lists of (key, checkpoint value, current value). Keys in
    ``architecture`` (and their sub-keys) are refused; the rest are applied. A key absent from
    one side (e.g. ``net`` of a module built in Python, not saved) is not compared."""
    saved, current, arch = _plain(dict(saved)), _plain(dict(current)), set(architecture)
    refused, applied = [], []
    for key in sorted(set(saved) & set(current)):
        for d in _diff(saved[key], current[key], key):
            (refused if key in arch else applied).append(d)
    return refused, applied


class ResumableModule(pl.LightningModule):
    """Base LightningModule: seeded per-batch randomness, divergence events, exact resume.

    Subclasses call :meth:`_init_resumable` in ``__init__`` (after ``save_hyperparameters``),
    log per-batch losses through :meth:`_log_train` and validation losses through
    :meth:`_val_seeds` / :meth:`_accumulate_val`, and call :meth:`_check_gradients` from
    ``on_before_optimizer_step`` (it returns whether the gradients need sanitising).
    """

    ARCHITECTURE_KEYS: frozenset = frozenset({"net"})

    def _init_resumable(self, seed: Optional[int], divergence_patience: int, on_divergence: str) -> None:
        """The seeded randomness and divergence state (the arguments are checked by the
        subclass's declared types: ``train_seed``, ``divergence_patience``, ``on_divergence``)."""
        self._train_seed: Optional[int] = None if seed is None else int(seed)  # (not a jsonargparse int)
        self.diverged = False
        self.diverged_at: Optional[dict] = None  # {"epoch", "step"} once diverged
        self.diverged_reason: Optional[str] = None  # what made it diverge, in words
        self._bad_steps = 0
        self._bad_cause = "nonfinite"
        self._last_loss: Optional[torch.Tensor] = None
        # the health state an explosion is measured against (kept in checkpoints)
        self._loss_ema: Optional[float] = None
        self._loss_floor = math.inf
        self._loss_steps = 0
        self._weight_norm0: Optional[float] = None
        self._epoch_sums: Dict[str, list] = {}
        self._val_sums: Dict[str, list] = {}

    def attached_trainer(self) -> Optional["pl.Trainer"]:
        """The Trainer this module is attached to, or None (``self.trainer`` raises then)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    # -- seeded randomness ---------------------------------------------------------------------
    @property
    def train_seed(self) -> int:
        if self._train_seed is None:
            self._train_seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        return self._train_seed

    def on_fit_start(self) -> None:
        _ = self.train_seed  # resolve now: after a checkpoint restored its seed, before training

    def on_train_batch_start(self, batch, batch_idx) -> None:
        k = self.trainer.fit_loop.epoch_loop.total_batch_idx
        seed_step(step_seed(self.train_seed, k, self.global_rank), self.device)

    # -- per-epoch means, logged before the epoch's checkpoint ---------------------------------
    def on_train_epoch_start(self) -> None:
        self._epoch_sums = {}

    def _log_train(self, values: Dict[str, torch.Tensor], batch_size: int, prog_bar: str = "train/loss") -> None:
        for name, v in values.items():
            v = v.detach()
            self.log(name, v, prog_bar=(name == prog_bar), on_step=True, on_epoch=False, batch_size=batch_size)
            s = self._epoch_sums.get(name)
            if s is None:
                s = self._epoch_sums[name] = [torch.zeros((), dtype=torch.float64, device=v.device), 0]
            s[0] = s[0] + v.to(torch.float64)
            s[1] += 1

    def on_train_epoch_end(self) -> None:
        if self.attached_trainer() is None:
            return
        self._check_weights()
        if not self._epoch_sums:
            return
        names = sorted(self._epoch_sums)
        sums = torch.stack([self._epoch_sums[n][0] for n in names])
        counts = torch.tensor([float(self._epoch_sums[n][1]) for n in names], dtype=torch.float64,
                              device=sums.device)
        sums, counts = self._reduce_sum(sums), self._reduce_sum(counts)
        metrics = {f"{n}_epoch": float(s / c) for n, s, c in zip(names, sums, counts)}
        self._log_direct(metrics)

    def _log_direct(self, metrics: Dict[str, float]) -> None:
        """Log to every logger now (not at Lightning's end-of-epoch flush) and expose the values
        to callbacks through ``trainer.callback_metrics``, at the step of the last optimizer step
        (Lightning's own logging step: one optimizer, automatic optimization)."""
        trainer = self.trainer
        step = max(int(trainer.global_step) - 1, 0)
        for name, v in metrics.items():
            trainer.callback_metrics[name] = torch.tensor(v)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(dict(metrics, epoch=trainer.current_epoch), step=step)

    def _reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the trainer's processes (:func:`strategy_comm`; ``t`` on one process)."""
        trainer = self.attached_trainer()
        comm = None if trainer is None else strategy_comm(trainer)
        return comm.reduce_sum(t.clone()) if comm is not None and comm.distributed() else t

    # -- divergence ----------------------------------------------------------------------------
    @property
    def unhealthy(self) -> bool:
        """Diverged, or inside a run of non-finite steps: no checkpoint should be written now."""
        return self.diverged or self._bad_steps > 0

    @property
    def divergence_factor(self) -> float:
        """``hparams.divergence_factor`` (0: explosions of finite values are not checked)."""
        return float(self.hparams.get("divergence_factor", DIVERGENCE_FACTOR) or 0.0)

    def _loss_exploded(self, value: float) -> bool:
        """Whether a finite step loss ``value`` exceeds ``divergence_factor`` times the lowest
        running mean of the loss so far (an EMA over ~1/LOSS_EMA_RATE steps, its minimum taken
        after LOSS_WARMUP_STEPS steps); a healthy loss updates the running mean."""
        factor = self.divergence_factor
        if factor > 0 and self._loss_steps >= LOSS_WARMUP_STEPS and value > factor * self._loss_floor:
            return True
        self._loss_ema = value if self._loss_ema is None else self._loss_ema + LOSS_EMA_RATE * (value - self._loss_ema)
        self._loss_steps += 1
        if self._loss_steps >= LOSS_WARMUP_STEPS:
            self._loss_floor = min(self._loss_floor, self._loss_ema)
        return False

    def _check_gradients(self, params) -> bool:
        """Count consecutive bad steps (``divergence_patience`` > 0) — a non-finite loss or
        gradient, or a finite loss that exploded (:meth:`_loss_exploded`) — and return whether
        every gradient is finite: sanitise them only when it is False.

        One fused reduction over the gradients (:func:`grads_finite`) and one host sync for all
        answers. The gradients are identical on every rank after DDP's all-reduce, so every rank
        takes the same decision; the loss is checked as well on a single process."""
        patience = int(self.hparams.divergence_patience)
        check_loss = patience > 0 and self._last_loss is not None and self.trainer.world_size <= 1
        g = grads_finite([p.grad for p in params if p.grad is not None])
        loss = self._last_loss.detach().double().mean() if check_loss else None
        if g is not None and loss is not None:
            grads_ok, value = torch.stack([g.double(), loss.to(g.device)]).tolist()
        else:
            grads_ok, value = (g is None or bool(g)), (None if loss is None else float(loss))
        loss_ok = value is None or math.isfinite(value)
        exploded = loss_ok and value is not None and grads_ok and self._loss_exploded(value)
        if patience > 0:
            bad = not (grads_ok and loss_ok) or exploded
            if bad:
                self._bad_cause = "loss" if exploded else "nonfinite"
                self._bad_value = value
            self._bad_steps = self._bad_steps + 1 if bad else 0
            if self._bad_steps >= patience and not self.diverged:
                self._on_diverged()
        return bool(grads_ok)

    def on_train_start(self) -> None:
        if self._weight_norm0 is None and hasattr(self, "trained_module"):
            self._weight_norm0 = self._weight_norm()

    def _weight_norm(self) -> float:
        """The l2 norm of the trained weights (NaN / inf when one is not finite)."""
        norms = [torch.linalg.vector_norm(p.detach().double()) for p in self.trained_module.parameters()]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    def _check_weights(self) -> None:
        """At the end of every training epoch: weights that are not finite, or whose norm grew to
        more than ``divergence_factor`` times the norm at the start of training, diverged."""
        if self.diverged or not int(self.hparams.divergence_patience) or not hasattr(self, "trained_module"):
            return
        norm = self._weight_norm()
        factor, norm0 = self.divergence_factor, self._weight_norm0
        if not math.isfinite(norm):
            self.declare_diverged("weights", "non-finite weights")
        elif factor > 0 and norm0 and norm > factor * norm0:
            self.declare_diverged("weights", f"the weights' norm {norm:.3g} grew above {factor:g} x its "
                                             f"start {norm0:.3g}")

    def on_train_end(self) -> None:
        """A run whose every step was non-finite diverged too, though it had fewer steps than
        ``divergence_patience`` (a short run on huge inputs): it is never reported as finished.
        (One bad last step of a long run is EDM's sanitised gradient, not a divergence.)"""
        patience = int(self.hparams.divergence_patience)
        steps = int(self.trainer.global_step)
        if not self.diverged and patience > 0 and 0 < steps <= self._bad_steps:
            self._on_diverged()

    def declare_diverged(self, cause: str, reason: str) -> None:
        """Make the model diverged now, for ``cause`` (a key of :data:`DIVERGENCE_CAUSES`:
        ``"weights"``, ``"collapse"``, ...) said as ``reason``: the same event as non-finite
        steps (logged, said once, training stops with ``on_divergence="stop"``). A monitor that
        finds the model's outputs collapsed calls it (``"collapse"``). Once only."""
        if self.diverged or self.attached_trainer() is None:
            return
        self._bad_cause = cause
        self._on_diverged(reason)

    def _on_diverged(self, reason: Optional[str] = None) -> None:
        trainer = self.trainer
        self.diverged = True
        step, epoch = int(trainer.global_step), int(trainer.current_epoch)
        self.diverged_at = {"epoch": epoch, "step": step}
        if reason is None and self._bad_cause == "loss":
            reason = (f"a finite loss ({getattr(self, '_bad_value', math.nan):.3g}) above "
                      f"{self.divergence_factor:g} x its lowest running mean ({self._loss_floor:.3g}) for "
                      f"{self._bad_steps} consecutive steps")
        elif reason is None:
            reason = f"non-finite loss or gradients for {self._bad_steps} consecutive steps"
        self.diverged_reason = reason
        self._log_direct({"events/diverged_step": float(step), "events/diverged_epoch": float(epoch),
                          "events/diverged_cause": float(DIVERGENCE_CAUSES.index(self._bad_cause) + 1)})
        action = self.hparams.on_divergence
        if action == "stop":
            trainer.should_stop = True
        kept = _last_good_checkpoint(trainer)
        kept = (f"the last good checkpoint is {kept}" if kept else
                "no checkpoint was written before it")
        rank_zero_info(
            f"[lightning_pfd] event: diverged — {reason} (step {step}, epoch {epoch}); "
            + (f"training stops, no further checkpoint is written; {kept}"
               if action == "stop" else "training continues (on_divergence=continue); "
               f"no further checkpoint is written; {kept}"))

    # -- world-size invariant validation loss --------------------------------------------------
    def _val_seeds(self, batch_idx: int, n: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(seeds, keep) of a validation batch: seed = offset + the sample's index in the
        validation set; keep = False for the padded duplicates of a distributed sampler."""
        trainer = self.attached_trainer()
        loader = trainer.val_dataloaders if trainer is not None else None
        if isinstance(loader, (list, tuple)):
            loader = loader[0] if loader else None
        bs = getattr(loader, "batch_size", None) or n
        sampler = getattr(loader, "sampler", None)
        world = int(getattr(sampler, "num_replicas", 1) or 1)
        rank = int(getattr(sampler, "rank", 0) or 0)
        try:
            total = len(loader.dataset)
        except (AttributeError, TypeError):
            total = None
        pos = (batch_idx * bs + torch.arange(n)) * world + rank  # position in the padded order
        if total:
            keep, index = pos < total, pos % total
        else:
            keep, index = torch.ones(n, dtype=torch.bool), pos
        return (VAL_SEED_OFFSET + index).to(device), keep.to(device)

    def on_validation_epoch_start(self) -> None:
        self._val_sums = {}

    def _accumulate_val(self, name: str, per_sample: torch.Tensor, keep: torch.Tensor) -> None:
        v = per_sample.detach().to(torch.float64)
        s = self._val_sums.setdefault(name, [torch.zeros((), dtype=torch.float64, device=v.device),
                                             torch.zeros((), dtype=torch.float64, device=v.device)])
        s[0] = s[0] + (v * keep).sum()
        s[1] = s[1] + keep.sum()

    def on_validation_epoch_end(self) -> None:
        for name, (s, c) in sorted(self._val_sums.items()):
            s, c = self._reduce_sum(s), self._reduce_sum(c)
            value = (s / c) if c > 0 else torch.tensor(float("nan"), dtype=torch.float64)
            self.log(name, value.to(torch.float32), prog_bar=(name == "val/loss"), sync_dist=False)

    # -- checkpoints ---------------------------------------------------------------------------
    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None,
                             strict=None, weights_only=None, **kwargs):
        """Lightning's ``load_from_checkpoint`` after verifying the file (missing, empty,
        truncated, foreign or damaged → :class:`~lightning_pfd.checkpoint.CheckpointError`);
        always ``weights_only`` loading."""
        if isinstance(checkpoint_path, (str, os.PathLike)):
            checkpoint_path = verified_stream(checkpoint_path)
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location,
                                            hparams_file=hparams_file, strict=strict,
                                            weights_only=True, **kwargs)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lightning_pfd"] = {"train_seed": self.train_seed, "loss_ema": self._loss_ema,
                                       "loss_floor": self._loss_floor, "loss_steps": self._loss_steps,
                                       "weight_norm0": self._weight_norm0}

    #: a resume may change the optimizer or schedule class (``fit --allow-optimizer-change``):
    #: the checkpoint's weights are kept, the optimizer and schedule start afresh
    allow_optimizer_change: bool = False

    def resume_changes(self, checkpoint: dict, source: str = "the checkpoint",
                       name: Callable[[str], str] = "model.{}".format,
                       allow_optimizer_change: Optional[bool] = None) -> List[str]:
        """Compare a checkpoint's hyper-parameters with this module's.

        Raises :class:`ConfigError` listing every architecture/diffusion-family conflict, and
        another optimizer or LR-schedule class unless ``allow_optimizer_change`` (default: the
        module's attribute of that name); returns one line per other difference (those are
        applied when resuming). An argument ``k`` is named ``name(k)`` (``model.k``; the command
        line gives its config path)."""
        saved = checkpoint.get("hyper_parameters") or {}
        refused, applied = compare_hparams(saved, dict(self.hparams), self.ARCHITECTURE_KEYS)
        if refused:
            raise ConfigError(
                "ckpt_path", f"{source} was made with another architecture or diffusion family: "
                + "; ".join(f"{name(k)}: checkpoint {a!r}, now {b!r}" for k, a, b in refused),
                suggestion="drop these overrides to resume, or start a new run without --ckpt_path")
        changed = optimizer_class_changes(saved, dict(self.hparams))
        allow = self.allow_optimizer_change if allow_optimizer_change is None else allow_optimizer_change
        if changed and not allow:
            raise ConfigError(
                "ckpt_path", f"{source} was trained with another optimizer or learning-rate schedule: "
                + "; ".join(f"{name(k)}: checkpoint {a or 'none'}, now {b or 'none'}" for k, a, b in changed),
                suggestion="resume with the checkpoint's optimizer and schedule, start a new run, or "
                           "pass --allow-optimizer-change (Python: module.allow_optimizer_change = True) "
                           "to continue from its weights with a fresh optimizer and schedule state")
        keys = {k for k, _a, _b in changed}
        lines = [f"resuming with {name(k)} = {b!r} (the checkpoint was trained with {a!r})"
                 for k, a, b in applied if k.split(".")[0] not in keys]
        lines += [f"--allow-optimizer-change: {name(k)} {a or 'none'} -> {b or 'none'}; the optimizer "
                  "and schedule start afresh from the checkpoint's weights" for k, a, b in changed]
        return lines

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        own = checkpoint.get("lightning_pfd") or {}
        saved = own.get("train_seed")
        if saved is not None:
            self._train_seed = int(saved)
        if "loss_steps" in own:  # the explosion checks continue where they were
            self._loss_ema = None if own["loss_ema"] is None else float(own["loss_ema"])
            self._loss_floor, self._loss_steps = float(own["loss_floor"]), int(own["loss_steps"])
            self._weight_norm0 = None if own["weight_norm0"] is None else float(own["weight_norm0"])
        for line in self.resume_changes(checkpoint):
            rank_zero_info(f"[lightning_pfd] {line}")
        changed = {k for k, _a, _b in optimizer_class_changes(checkpoint.get("hyper_parameters") or {},
                                                              dict(self.hparams))}
        if "optimizer" in changed:  # (allowed, else resume_changes raised): fresh states
            checkpoint["optimizer_states"] = []
        if changed:
            checkpoint["lr_schedulers"] = []
        apply_optimizer_hparams(checkpoint, self.hparams)


def _last_good_checkpoint(trainer) -> Optional[str]:
    """The newest checkpoint file this fit's checkpoint callbacks wrote (None when none exists)."""
    paths = [getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")
             for cb in getattr(trainer, "checkpoint_callbacks", [])]
    paths = [p for p in paths if p and "://" not in str(p) and os.path.isfile(p)]
    return max(paths, key=os.path.getmtime) if paths else None


def check_training_args(net, betas) -> None:
    """What the declared types of an :class:`EMAModule`'s arguments cannot say, checked before
    anything is built: the net exposes ``data_shape``, and ``betas`` are two numbers in [0, 1)
    (Adam itself would refuse them only when the optimizer is built, after the loggers started)."""
    if not hasattr(net, "data_shape"):
        raise ConfigError("net", "must expose `data_shape` (the shape of one sample)",
                          value=type(net).__name__, accepted="lightning_pfd.nets.UNet, MLPNet, ...")
    b = list(betas) if isinstance(betas, (list, tuple)) else None
    if b is None or len(b) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and 0.0 <= v < 1.0 for v in b):
        raise ConfigError("betas", "must be two numbers in [0, 1)", value=betas, accepted="e.g. [0.9, 0.999]")


def check_optimization(optimizer, lr_scheduler, lr, betas, weight_decay, warmup_steps) -> Tuple[Optional[dict], Optional[dict]]:
    """The checked plain forms of an :class:`EMAModule`'s ``optimizer`` and ``lr_scheduler``
    (:func:`~lightning_pfd.modules.optim.optimizer_spec`, ``scheduler_spec``), built once on a
    throwaway parameter so a bad class or value fails before anything else is built."""
    from .optim import optimizer_spec, scheduler_spec

    hp = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "warmup_steps": warmup_steps}
    opt = optimizer_spec(optimizer, hp)
    return opt, scheduler_spec(lr_scheduler, opt, hp)


def record_optimization(module: "EMAModule", optimizer: Optional[dict], lr_scheduler: Optional[dict]) -> None:
    """``hparams.optimizer`` / ``hparams.lr_scheduler`` = the checked plain forms (what the
    checkpoint, ``hparams.yaml`` and the W&B config hold); nothing changes for the default."""
    if optimizer is None and lr_scheduler is None:
        return
    module.hparams["optimizer"], module.hparams["lr_scheduler"] = optimizer, lr_scheduler
    module.save_hyperparameters(dict(module.hparams))  # loggers write hparams_initial


def limit_cpu_threads(trainer) -> None:
    """torch.set_num_threads(max(1, cores // local processes)) for multi-process CPU runs (two
    2-thread ranks on 2 cores run ~20x slower than two 1-thread ranks)."""
    if trainer is None or trainer.world_size <= 1:
        return
    if getattr(trainer.strategy.root_device, "type", "cpu") != "cpu":
        return
    local = max(1, getattr(trainer, "num_devices", trainer.world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


class StepLists:
    """The tensors every training step touches, gathered once (walking the module tree costs
    a cost per step for small nets): the trained parameters in ``parameters()`` order
    (gradient guard and clip), the (EMA, live) parameter pairs matched by name and the buffer
    pairs, and a host copy of the EMA's update counter (no device read per step).

    :meth:`ema_update` is ``EMA.update(model, beta)`` bit for bit (EDM's EMA, Karras et al. 2022,
    App. F: shadow <- beta * shadow + (1 - beta) * live, as one fused lerp). The lists hold the
    parameter objects, so they follow in-place loads and device moves of their data; the owner
    rebuilds them when parameter objects may have been replaced (``_apply``, ``load_state_dict``,
    fit / epoch start)."""

    def __init__(self, ema: EMA, model: nn.Module):
        self.ema, self.model = ema, model
        self.params: List[nn.Parameter] = list(model.parameters())
        live = dict(model.named_parameters())
        named = list(ema.shadow.named_parameters())
        missing = [n for n, _ in named if n not in live]
        if missing:
            raise ValueError(f"ema: model lacks parameters {missing[:3]}")
        self.ema_params = [p for _, p in named]
        self.live_params = [live[n] for n, _ in named]
        self.buffers = list(zip(ema.shadow.buffers(), model.buffers()))
        # a dtype or device mismatch (e.g. a precision plugin converted one side) takes EMA.update
        self.fused = all(e.dtype == p.dtype and e.device == p.device
                         for e, p in zip(self.ema_params, self.live_params))
        self._counter: Optional[torch.Tensor] = None
        self._count, self._generation = 0, -1

    def valid_for(self, ema: EMA, model: nn.Module) -> bool:
        return self.ema is ema and self.model is model

    def num_updates(self) -> int:
        """``int(ema.num_updates)``, read from the device only when the counter was replaced or
        written elsewhere (``EMA.generation`` moved: a checkpoint load, ``EMA.update``)."""
        c, generation = self.ema.num_updates, self.ema.generation
        if c is not self._counter or generation != self._generation:
            self._counter, self._count, self._generation = c, int(c), generation
        return self._count

    @torch.no_grad()
    def ema_update(self, beta: float) -> None:
        """``EMA.update(model, beta)`` with the lists gathered once."""
        if not self.fused:
            self.ema.update(self.model, beta)
            return
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"ema decay: must lie in [0, 1], got {beta}")
        n = self.num_updates()
        if self.ema_params:
            torch._foreach_lerp_(self.ema_params, self.live_params, 1.0 - beta)
        for b_ema, b_live in self.buffers:
            b_ema.copy_(b_live)
        self._counter.add_(1)
        self._count = n + 1


class EMAModule(ResumableModule):
    """A trained network with an EMA copy for evaluation: the part ``DiffusionModule`` and
    ``LevyItoModule`` share.

    Subclasses set ``TRAINED`` (the attribute holding the ``nn.Module`` whose parameters Adam
    optimizes: ``"live_denoiser"``, ``"score_net"``), keep the raw network in ``self.net``, define
    ``loss_fn(model, y, seeds=None) -> (B,)``, expose the EMA copy under the name of what it is
    (``denoiser``, ``score_model``) and, in ``__init__``:

    1. :func:`~lightning_pfd.validation.check_args` (the declared types), then
       :func:`check_training_args` and their own checks, before building anything;
    2. ``save_hyperparameters``, build the trained module;
    3. call :meth:`_init_ema` (the EMA copy, then :meth:`ResumableModule._init_resumable`).

    Provided: ``data_shape``, ``setup`` (thread cap for CPU DDP, :func:`check_data_shape`),
    ``training_step`` (mean of the per-sample loss of the live weights, logged through
    :meth:`_train_metrics`), ``validation_step`` (frozen-noise loss of the EMA weights, seeded by
    the sample's global index, extras through :meth:`_accumulate_val_extra`), the gradient guard
    (divergence count, NaN -> 0 / +-inf -> +-1e5, optional ``hparams.gradient_clip_val``), one EMA
    update per optimizer step and Adam with warm-up.
    """

    TRAINED: str = ""

    def _init_ema(self, seed: Optional[int], divergence_patience: int, on_divergence: str) -> None:
        self.ema = EMA(self.trained_module)
        self._init_resumable(seed, divergence_patience, on_divergence)

    # -- the per-step tensor lists (StepLists), rebuilt where parameter objects may change ---------
    def step_lists(self) -> StepLists:
        """The :class:`StepLists` of the current EMA and trained module (built on first use)."""
        lists = self.__dict__.get("_step_lists")
        ema, model = self.ema, self.trained_module
        if lists is None or not lists.valid_for(ema, model):
            lists = StepLists(ema, model)
            self.__dict__["_step_lists"] = lists
        return lists

    def _drop_step_lists(self) -> None:
        self.__dict__.pop("_step_lists", None)

    def _apply(self, fn, *args, **kwargs):  # .to(), .cuda(), .half(), ...: parameters may be new objects
        self._drop_step_lists()
        return super()._apply(fn, *args, **kwargs)

    def load_state_dict(self, *args, **kwargs):  # assign=True replaces parameter objects
        self._drop_step_lists()
        return super().load_state_dict(*args, **kwargs)

    def __getstate__(self):  # never pickle / copy the lists (references into the live modules)
        state = super().__getstate__()
        state.pop("_step_lists", None)
        return state

    def on_fit_start(self) -> None:
        self._drop_step_lists()
        super().on_fit_start()

    def on_train_epoch_start(self) -> None:
        self._drop_step_lists()
        super().on_train_epoch_start()

    # -- what the subclasses and callbacks see --------------------------------------------------
    @property
    def trained_module(self) -> nn.Module:
        """The module whose parameters are optimized (live weights)."""
        return getattr(self, self.TRAINED)

    @property
    def data_shape(self) -> tuple:
        return tuple(self.net.data_shape)

    @staticmethod
    def _images(batch) -> torch.Tensor:
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def setup(self, stage: str) -> None:
        """Fail before any training if the data's sample shape does not fit the net; cap the
        intra-op threads of CPU DDP ranks."""
        trainer = self.attached_trainer()
        limit_cpu_threads(trainer)
        dm = getattr(trainer, "datamodule", None) if trainer is not None else None
        check_data_shape(self, dm, field="net")

    # -- steps ---------------------------------------------------------------------------------
    def _train_metrics(self, loss: torch.Tensor, per_sample: torch.Tensor) -> Dict[str, torch.Tensor]:
        """What a training step logs (``train/loss`` is the optimized mean)."""
        return {"train/loss": loss}

    def _accumulate_val_extra(self, per_sample: torch.Tensor, keep: torch.Tensor) -> None:
        """Validation values besides ``val/loss`` (none by default)."""

    def training_step(self, batch, batch_idx):
        y = self._images(batch)
        per = self.loss_fn(self.trained_module, y)
        loss = per.mean()
        self._last_loss = loss.detach()
        self._log_train(self._train_metrics(loss, per.detach()), y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        """Frozen-noise loss of the EMA weights; seeds by the sample's index in the validation
        set, so ``val/loss`` is the same for any number of processes."""
        y = self._images(batch)
        seeds, keep = self._val_seeds(batch_idx, y.shape[0], y.device)
        per = self.loss_fn(self.ema.shadow, y, seeds=seeds)
        self._accumulate_val("val/loss", per, keep)
        self._accumulate_val_extra(per, keep)
        return per.mean()

    def on_before_optimizer_step(self, optimizer) -> None:
        """Count non-finite steps (divergence), then EDM's guard (NaN gradients -> 0, +-inf ->
        +-1e5: applied only when a gradient is non-finite, where it changes something) and the
        optional global grad-norm clip ``hparams.gradient_clip_val``."""
        params = [p for p in self.step_lists().params if p.grad is not None]
        if not self._check_gradients(params):
            sanitize_gradients(params)
        clip = self.hparams.get("gradient_clip_val")
        if clip:
            torch.nn.utils.clip_grad_norm_(params, float(clip))

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """One EMA update (``modules.ema.ema_step``'s decay and update, with :class:`StepLists`)."""
        trainer = self.attached_trainer()
        world = trainer.world_size if trainer is not None else 1
        lists, hp = self.step_lists(), self.hparams
        beta = ema_beta(lists.num_updates(), self._images(batch).shape[0] * max(1, world), hp.ema_decay,
                        hp.ema_halflife_kimg, hp.ema_rampup)
        lists.ema_update(beta)

    def configure_optimizers(self):
        """EDM's Adam with warm-up, or the configured ``optimizer`` / ``lr_scheduler``
        (:func:`~lightning_pfd.modules.optim.configure_optimization`)."""
        return configure_optimization(self.trained_module.parameters(), self.hparams, self.device)
