"""GeneralizationMonitor: E_gen, E_mem and the frozen-noise losses every epoch (PFD paper Sec. 3-4,
App. C.3, C.6; REFERENCE §6-7).

At fit (or validate) start it fixes M evaluation seeds x_gen,T, disjoint from the training and
test seeds (``datamodule.gen_seed_offset``, default 2_000_000), and computes -- once, cached on
disk under a hash of everything they depend on -- the teacher's endpoints Phi_data(x_gen,T)
(when ``datamodule.teacher`` is set) and the empirical endpoints Phi_emp(x_gen,T) of the training
set (the closed-form denoiser of eq. 46), together with their descriptors Psi. On every
``every_n_epochs``-th validation pass (the first always; ``_schedule.py``), in
``on_validation_epoch_end`` on every rank (``on_train_epoch_end`` when the fit has no validation), only the student's
endpoints are recomputed (EMA denoiser ``pl_module.denoiser``) on this rank's shard
seeds[rank::world] (no padding sampler), and

    pfd/e_gen = PFD(p_theta, p_data)      pfd/e_mem = PFD(p_theta, p_emp)           (eq. 8)
    loss/train_fixed, loss/test_fixed     (eq. 10 with frozen noise and sigma per sample)
    loss/gap = loss/test_fixed - loss/train_fixed                                (App. C.6)

are logged (values are already synced: float64 sum states reduced over ranks), with
``pfd/nonfinite``, the fraction of the M student endpoints (or their features) that are NaN/inf.
When that fraction is > 0 (a diverged student) E_gen and E_mem are NaN -- never a number computed
from a part of the seeds -- and one warning line is printed the first time; the decision is taken
on the all-reduced count, so every rank takes the same branch. Every ``image_every_n_epochs``
passes a grid of samples (rows: student, teacher, empirical; columns: the same seeds, like the
paper's Fig. 1) goes to the logger's ``log_image`` or to a PNG file.

One PF-ODE solver for the three flows: the student's grid (``sigmas``, else ``pl_module.sigmas``)
and sampler (``sampler``, else the module's ``hparams.sampler``) are used for the student, the
teacher and the empirical flows, and :meth:`GeneralizationMonitor.check_setup` refuses a teacher
datamodule whose own grid / sampler (``teacher_sigmas``, ``sampler``: the solver that generated
the training set) differ -- E_gen would otherwise compare, e.g., Heun-5 student endpoints with
Heun-18 teacher endpoints. ``name`` moves every key into another namespace (``<name>/e_gen``,
``<name>/train_fixed``, ...) so that two monitors (e.g. two descriptors) can run side by side;
each keeps its own checkpoint state (``state_key``).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Sequence

import lightning.pytorch as pl
import torch
from torchmetrics import Metric

from ..cache import cache_dir, hash_key, load_tensor_verified, save_tensor_atomic
from ..diffusion import EmpiricalDenoiser, clamp_sigmas, karras_sigmas, sample_endpoints
from ..diffusion.sampling import SAMPLERS
from ..errors import ConfigError
from ..metrics.descriptors import build_descriptor, descriptor_fingerprint
from ..metrics.pfd import ProbabilityFlowDistance
from ._schedule import (SIGMA_SPACE_MODULES, ScheduledMonitor, callback_field, check_metric_prefix,
                        check_unique_metric_names, global_sum, require_train_data)

__all__ = ["GeneralizationMonitor"]

DEFAULT_GEN_SEED_OFFSET = 2_000_000
LOSS_TRAIN_SEED_OFFSET = 20_000_000  # frozen (noise, sigma) of the i-th training sample
LOSS_TEST_SEED_OFFSET = 30_000_000  # ... of the i-th held-out sample
_CACHE_VERSION = 1
#: leaf -> logged key with the default namespace (``name=None``)
DEFAULT_KEYS = {"e_gen": "pfd/e_gen", "e_mem": "pfd/e_mem", "nonfinite": "pfd/nonfinite",
                "samples": "pfd/samples", "train_fixed": "loss/train_fixed",
                "test_fixed": "loss/test_fixed", "gap": "loss/gap"}
_GRID_ARGS = ("num_steps", "sigma_min", "sigma_max", "rho")


class _Mean(Metric):
    """float64 sum / count, summed over ranks (exact under DDP)."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        self.total += values.detach().to(device=self.total.device, dtype=torch.float64).sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count if float(self.count) > 0 else torch.tensor(math.nan, dtype=torch.float64)


class GeneralizationMonitor(ScheduledMonitor):
    """Log E_gen, E_mem (PFD), frozen-noise train/test losses and their gap every epoch.

    Args:
        num_eval: M, the number of evaluation seeds x_gen,T (paper: 10^4; default 1024).
        every_n_epochs: evaluate on every n-th validation pass (the first always), or every n-th
            training epoch when the fit has no validation loop.
        descriptor: Psi for PFD (None / "identity", "efficientnet_lite0", a TorchScript path, a module).
        sampler: "heun" (EDM Alg. 1) or "euler", the same for student, teacher and empirical flows;
            None (default): the module's ``hparams.sampler`` (Heun for DiffusionModule's default).
        sigmas: the sigma grid; None = ``pl_module.sigmas`` if present, else EDM's 18-step grid.
        batch_size: samples per sampler batch (memory knob).
        chunk_size: training-set chunk of the empirical denoiser (memory knob).
        num_loss_samples: how many (fixed, leading) training / held-out samples enter the
            frozen-noise losses (at most all of them); None = all.
        image_every_n_epochs: validation passes between sample grids (0 disables; a grid only on
            a measured pass); image data only.
        num_images: columns of the sample grid.
        use_cache: read/write the on-disk cache (``$LIGHTNING_PFD_CACHE``).
        name: metric namespace; None = the standard keys (``pfd/e_gen``, ``pfd/e_mem``,
            ``pfd/nonfinite``, ``loss/train_fixed``, ``loss/test_fixed``, ``loss/gap``), a string
            ``X`` = ``X/e_gen``, ``X/e_mem``, ``X/nonfinite``, ``X/train_fixed``, ... (needed for a
            second GeneralizationMonitor in the same Trainer).
    """

    def __init__(self, num_eval: int = 1024, every_n_epochs: int = 1, descriptor: Any = None,
                 sampler: Optional[str] = None, sigmas: Optional[Sequence[float]] = None,
                 batch_size: int = 256, chunk_size: int = 4096,
                 num_loss_samples: Optional[int] = 1024, image_every_n_epochs: int = 10,
                 num_images: int = 8, use_cache: bool = True, name: Optional[str] = None):
        super().__init__()
        for arg, v, lo in (("num_eval", num_eval, 1), ("every_n_epochs", every_n_epochs, 1),
                           ("batch_size", batch_size, 1), ("chunk_size", chunk_size, 1),
                           ("image_every_n_epochs", image_every_n_epochs, 0), ("num_images", num_images, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(callback_field(self, arg), f"must be an integer >= {lo}", value=v)
        if num_loss_samples is not None and (isinstance(num_loss_samples, bool) or
                                             not isinstance(num_loss_samples, int) or num_loss_samples < 1):
            raise ConfigError(callback_field(self, "num_loss_samples"), "must be None or an integer >= 1",
                              value=num_loss_samples)
        if sampler is not None and sampler not in SAMPLERS:
            raise ConfigError(callback_field(self, "sampler"), "unknown sampler", value=sampler,
                              accepted=sorted(SAMPLERS))
        self.name = None if name is None else check_metric_prefix(self, "name", name)
        self.num_eval, self.every_n_epochs = num_eval, every_n_epochs
        self.descriptor_spec = descriptor
        self.descriptor = build_descriptor(descriptor)  # fails now, before training, if unavailable
        self.sampler, self.batch_size, self.chunk_size = sampler, batch_size, chunk_size
        self.sigmas = None if sigmas is None else torch.as_tensor(sigmas, dtype=torch.float64)
        self.num_loss_samples = num_loss_samples
        self.image_every_n_epochs, self.num_images = image_every_n_epochs, num_images
        self.use_cache = use_cache
        self.history: list[Dict[str, float]] = []
        self.cache_keys: Dict[str, str] = {}
        self._ref: Optional[Dict[str, Dict[str, torch.Tensor]]] = None  # name -> {endpoints, features}
        self._seeds: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ names and state key
    def key(self, leaf: str) -> str:
        """The logged name of ``leaf`` (``e_gen``, ``e_mem``, ``nonfinite``, ``train_fixed``, ...)."""
        return DEFAULT_KEYS[leaf] if self.name is None else f"{self.name}/{leaf}"

    def metric_names(self) -> list:
        return [self.key(leaf) for leaf in DEFAULT_KEYS]

    @property
    def state_key(self) -> str:
        """Built from the arguments that define the measurement (namespace, descriptor, M):
        several monitors keep and resume their own state."""
        spec = self.descriptor_spec
        desc = "identity" if spec is None else spec if isinstance(spec, str) else type(spec).__name__
        return self._generate_state_key(name=self.name or "pfd", descriptor=desc, num_eval=self.num_eval)

    # ------------------------------------------------------------------ checks (before training)
    def check_setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", datamodule: Any) -> None:
        """Raise :class:`ConfigError` for every incompatibility detectable without sampling:
        num_eval vs world size and vs the datamodule's reserved range ``n_gen``; no datamodule /
        training set; a module without a sigma-space denoiser; a teacher without fingerprint; a
        teacher grid or sampler different from the student's; more grid columns than rank 0's
        seeds; a descriptor that fails on the data; another monitor logging the same keys."""
        self._check_world(trainer.world_size)
        data = require_train_data(self, datamodule)
        self._check_module(pl_module)
        self._check_n_gen(datamodule)
        teacher = getattr(datamodule, "teacher", None)
        if teacher is not None:
            self._check_teacher_fingerprint(datamodule, teacher)
            self._check_teacher_grid(pl_module, datamodule, teacher)
        self._check_num_images(tuple(data.shape[1:]), trainer.world_size)
        check_unique_metric_names(self, trainer)
        self._check_descriptor(data)

    def _check_world(self, world_size: int) -> None:
        if self.num_eval < world_size:  # an empty shard would hang the all_gather of the references
            raise ConfigError(callback_field(self, "num_eval"),
                              f"{self.num_eval} evaluation seeds for world size {world_size}: every rank "
                              "needs at least one", value=self.num_eval,
                              accepted=f"an integer >= the world size ({world_size})")

    def _check_module(self, pl_module) -> None:
        if not hasattr(pl_module, "denoiser") or not hasattr(pl_module, "loss_fn"):
            raise ConfigError("model", f"GeneralizationMonitor needs a sigma-space denoiser: "
                              f"{type(pl_module).__name__} has no `denoiser` / `loss_fn` (PFD compares "
                              "PF-ODE maps of sigma-space denoisers)",
                              value=type(pl_module).__name__, accepted=SIGMA_SPACE_MODULES + " and `loss_fn`",
                              suggestion="for LevyItoModule use TailMonitor and MemorizationMonitor")

    def _check_n_gen(self, dm) -> None:
        n_gen = getattr(dm, "n_gen", None)
        if n_gen is not None and self.num_eval > int(n_gen):
            raise ConfigError(callback_field(self, "num_eval"),
                              f"exceeds the datamodule's reserved evaluation range n_gen = {n_gen} "
                              "(the evaluation seeds must stay disjoint from the training / test seeds)",
                              value=self.num_eval, accepted=f"an integer in [1, {n_gen}]",
                              suggestion="lower num_eval or raise data.init_args.n_gen")

    @staticmethod
    def _teacher_fingerprint_fn(dm, teacher):
        return getattr(dm, "teacher_fingerprint", None) or getattr(teacher, "fingerprint", None)

    def _check_teacher_fingerprint(self, dm, teacher) -> None:
        if self._teacher_fingerprint_fn(dm, teacher) is None:
            raise ConfigError("data.teacher", "needs a fingerprint() method (it keys the endpoint cache)",
                              value=type(teacher).__name__)

    def _flow_sampler(self, pl_module) -> str:
        """The sampler of all three flows: ``sampler``, else the module's, else Heun."""
        if self.sampler is not None:
            return self.sampler
        s = _hparams(pl_module).get("sampler")
        return s if s in SAMPLERS else "heun"

    def _check_teacher_grid(self, pl_module, dm, teacher) -> None:
        """One grid and sampler: the student's must be the teacher datamodule's (the solver that
        generated the training set and gives the teacher endpoints of E_gen)."""
        t_grid = getattr(dm, "teacher_sigmas", None)
        if t_grid is None:  # e.g. an exact GMM law: its flow is computed on the student's grid
            return
        student = self._grid(pl_module)
        t_grid = clamp_sigmas(torch.as_tensor(t_grid, dtype=torch.float64), teacher)
        sampler, t_sampler = self._flow_sampler(pl_module), getattr(dm, "sampler", None)
        t_sampler = t_sampler if isinstance(t_sampler, str) else sampler
        same = student.shape == t_grid.shape and torch.allclose(student, t_grid, rtol=1e-9, atol=0.0)
        if same and sampler == t_sampler:
            return
        ours = _describe_solver(_hparams(pl_module) if self.sigmas is None else {}, student, sampler)
        theirs = _describe_solver(_hparams(dm), t_grid, t_sampler)
        if ours == theirs:  # same settings, different effective grids (clamped to other ranges)
            ours, theirs = _describe_solver({}, student, sampler), _describe_solver({}, t_grid, t_sampler)
        problem = (f"student and teacher flows need one PF-ODE grid and sampler, but the student's is "
                   f"{ours} and the teacher data's is {theirs} (E_gen would compare endpoints of two "
                   "different solvers)")
        if same:  # only the sampler differs
            field = callback_field(self, "sampler") if self.sampler is not None else "model.init_args.sampler"
            raise ConfigError(field, problem, value=sampler, accepted=[t_sampler],
                              suggestion="use the same sampler in the model (or the monitor) and in "
                                         "data.init_args.sampler")
        if self.sigmas is not None:
            raise ConfigError(callback_field(self, "sigmas"), problem,
                              suggestion="drop the monitor's sigmas or give the teacher's grid")
        arg = _first_difference(_hparams(pl_module), _hparams(dm))
        field = f"model.init_args.{arg}" if arg else "model.init_args.num_steps"
        raise ConfigError(field, problem, value=_hparams(pl_module).get(arg or "num_steps"),
                          suggestion=f"set model.init_args.{arg or 'num_steps'} and "
                                     f"data.init_args.{arg or 'num_steps'} to the same value")

    def _check_num_images(self, shape, world_size: int) -> None:
        if not (self.image_every_n_epochs and len(shape) == 3 and shape[0] in (1, 3)):
            return  # no sample grid for these data
        on_rank0 = len(range(0, self.num_eval, world_size))
        if self.num_images > on_rank0:
            raise ConfigError(callback_field(self, "num_images"),
                              f"the sample grid has more columns than the {on_rank0} seeds rank 0 "
                              f"evaluates (num_eval = {self.num_eval}, world size {world_size})",
                              value=self.num_images, accepted=f"an integer in [1, {on_rank0}]")

    def _check_descriptor(self, data: torch.Tensor) -> None:
        """Psi must accept two samples shaped like the data (endpoints have the data's shape)."""
        try:
            feats = self._features(data[:2].to(torch.float64))
        except Exception as e:  # a descriptor built for other data (e.g. an image net on vectors)
            raise ConfigError(callback_field(self, "descriptor"),
                              f"fails on samples of shape {tuple(data.shape[1:])}: {type(e).__name__}: {e}",
                              value=self.descriptor_spec) from e
        if feats.ndim != 2 or feats.shape[0] != min(2, len(data)):
            raise ConfigError(callback_field(self, "descriptor"), "must map a batch (B, ...) to "
                              f"features (B, F); got shape {tuple(feats.shape)}", value=self.descriptor_spec)

    # ------------------------------------------------------------------ setup (once per run)
    def _datamodule(self, trainer: "pl.Trainer"):
        dm = getattr(trainer, "datamodule", None)
        require_train_data(self, dm)
        return dm

    def _grid(self, pl_module) -> torch.Tensor:
        if self.sigmas is not None:
            return self.sigmas
        g = getattr(pl_module, "sigmas", None)
        return karras_sigmas() if g is None else torch.as_tensor(g, dtype=torch.float64).cpu()

    def _shard(self, trainer) -> torch.Tensor:
        """This rank's rows of the M evaluation seeds: positions rank, rank + world, ..."""
        return torch.arange(trainer.global_rank, self.num_eval, trainer.world_size)

    def _gather_rows(self, trainer, rows: torch.Tensor) -> torch.Tensor:
        """Reassemble the full (M, ...) tensor from every rank's strided shard."""
        world = trainer.world_size
        if world == 1:
            return rows
        import torch.distributed as dist

        per = math.ceil(self.num_eval / world)
        pad = torch.zeros(per, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        pad[: rows.shape[0]] = rows
        out = [torch.empty_like(pad) for _ in range(world)]
        dist.all_gather(out, pad)
        full = torch.empty(self.num_eval, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        for r in range(world):
            n_r = len(range(r, self.num_eval, world))
            full[r::world] = out[r][:n_r]
        return full

    def _reference(self, trainer, pl_module, name: str, denoiser_fn, fingerprint: str,
                   grid: torch.Tensor, shape) -> Dict[str, torch.Tensor]:
        """Endpoints + Psi features of a fixed flow on all M seeds: cached, or sharded + gathered."""
        sampler = self._flow_sampler(pl_module)
        key = hash_key("pfd-reference", _CACHE_VERSION, name, fingerprint, [int(s) for s in self._seeds],
                       [int(s) for s in shape], sampler, grid, descriptor_fingerprint(self.descriptor))
        self.cache_keys[name] = key
        path = cache_dir() / "pfd" / f"{name}_{key[:32]}.pt"
        hit = load_tensor_verified(path, key) if self.use_cache else None
        ok = hit is not None and hit["endpoints"].shape[0] == self.num_eval
        if self._all_true(trainer, ok, pl_module.device):  # every rank: the same branch (collectives below)
            return hit
        shard = self._shard(trainer)
        den = denoiser_fn()
        ends = sample_endpoints(den, self._seeds[shard], shape, sigmas=grid, sampler=sampler,
                                batch_size=self.batch_size, device=pl_module.device, out_device=pl_module.device)
        feats = self._features(ends)
        ends, feats = self._gather_rows(trainer, ends).cpu(), self._gather_rows(trainer, feats).cpu()
        out = {"endpoints": ends, "features": feats}
        if self.use_cache and trainer.global_rank == 0:
            save_tensor_atomic(path, out, key)
        return out

    @torch.no_grad()
    def _features(self, endpoints: torch.Tensor) -> torch.Tensor:
        psi = self.descriptor.to(endpoints.device)
        feats = [psi(b).reshape(b.shape[0], -1).to(torch.float64) for b in endpoints.split(self.batch_size)]
        if not feats:
            return torch.empty(0, 0, dtype=torch.float64, device=endpoints.device)
        return torch.cat(feats)

    def _prepare(self, trainer, pl_module) -> None:
        self._check_world(trainer.world_size)
        if self._ref is not None:
            return
        dm = self._datamodule(trainer)
        self._check_module(pl_module)
        self._check_n_gen(dm)
        offset = int(getattr(dm, "gen_seed_offset", DEFAULT_GEN_SEED_OFFSET))
        self._seeds = torch.arange(offset, offset + self.num_eval)
        shape = tuple(dm.train_data.shape[1:])
        grid = self._grid(pl_module)
        self._ref = {}
        teacher = getattr(dm, "teacher", None)
        if teacher is not None:
            self._check_teacher_fingerprint(dm, teacher)
            fp_fn = self._teacher_fingerprint_fn(dm, teacher)
            t_grid = getattr(dm, "teacher_sigmas", None)
            t_grid = grid if t_grid is None else torch.as_tensor(t_grid, dtype=torch.float64)

            def teacher_fn():
                return teacher.to(pl_module.device) if isinstance(teacher, torch.nn.Module) else teacher
            self._ref["teacher"] = self._reference(trainer, pl_module, "teacher", teacher_fn, str(fp_fn()),
                                                   clamp_sigmas(t_grid, teacher), shape)
            if isinstance(teacher, torch.nn.Module):
                teacher.to("cpu")  # not needed again this run: free accelerator memory
        fp = dm.fingerprint() if callable(getattr(dm, "fingerprint", None)) else hash_key(dm.train_data)

        def empirical_fn():
            return EmpiricalDenoiser(dm.train_data, chunk_size=self.chunk_size).to(pl_module.device)
        self._ref["empirical"] = self._reference(trainer, pl_module, "empirical", empirical_fn, fp, grid, shape)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._ref, self._seeds = None, None  # a new run may bring new data / teacher: prepare again
        super().setup(trainer, pl_module, stage)  # + check_setup at fit / validate

    def on_fit_start(self, trainer, pl_module) -> None:
        self._prepare(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._prepare(trainer, pl_module)

    # ------------------------------------------------------------------ every n-th validation pass
    @torch.no_grad()
    def _frozen_loss(self, trainer, pl_module, data: Optional[torch.Tensor],
                     seed_offset: int) -> Optional[torch.Tensor]:
        """Mean per-sample loss with frozen (noise, sigma) per sample (PFD paper App. C.6), sharded + synced."""
        if data is None or len(data) == 0:
            return None
        n = len(data) if self.num_loss_samples is None else min(len(data), self.num_loss_samples)
        idx = torch.arange(trainer.global_rank, n, trainer.world_size)
        acc = _Mean().to(pl_module.device)  # states on the module's device (NCCL sync needs GPU tensors)
        den = pl_module.denoiser
        for b in idx.split(self.batch_size):
            y = data[b].to(pl_module.device)
            acc.update(pl_module.loss_fn(den, y, seeds=seed_offset + b))
        return acc.compute()

    def _student(self, trainer, pl_module, shard: torch.Tensor, shape) -> torch.Tensor:
        seeds = self._seeds[shard]
        sampler = self._flow_sampler(pl_module)
        if hasattr(pl_module, "generate") and self.sigmas is None:
            return pl_module.generate(seeds, sampler=sampler, batch_size=self.batch_size)
        return sample_endpoints(pl_module.denoiser, seeds, shape, sigmas=self._grid(pl_module),
                                sampler=sampler, batch_size=self.batch_size,
                                device=pl_module.device, out_device=pl_module.device)

    @torch.no_grad()
    def _measure_and_log(self, trainer, pl_module) -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        self._prepare(trainer, pl_module)
        shape = tuple(self._ref["empirical"]["endpoints"].shape[1:])
        shard = self._shard(trainer)
        student = self._student(trainer, pl_module, shard, shape)
        values = self._pfd_values(trainer, pl_module, shard, student)
        dm = trainer.datamodule
        l_train = self._frozen_loss(trainer, pl_module, dm.train_data, LOSS_TRAIN_SEED_OFFSET)
        l_test = self._frozen_loss(trainer, pl_module, getattr(dm, "val_data", None), LOSS_TEST_SEED_OFFSET)
        if l_train is not None:
            values[self.key("train_fixed")] = l_train
        if l_test is not None:
            values[self.key("test_fixed")] = l_test
            if l_train is not None:
                values[self.key("gap")] = l_test - l_train
        for k, v in values.items():
            pl_module.log(k, v, sync_dist=False, on_epoch=True, on_step=False, batch_size=1)
        self.history.append({"epoch": int(trainer.current_epoch), **{k: float(v) for k, v in values.items()}})
        if (self.image_every_n_epochs and self.schedule.index % self.image_every_n_epochs == 0
                and trainer.global_rank == 0 and len(shape) == 3 and shape[0] in (1, 3)):
            self._log_grid(trainer, shard, student)

    def _pfd_values(self, trainer, pl_module, shard: torch.Tensor,
                    student: torch.Tensor) -> Dict[str, torch.Tensor]:
        """E_gen, E_mem and the non-finite fraction; NaN PFDs when any endpoint is non-finite.

        The branch is decided on the all-reduced count of non-finite rows, so every rank calls
        the PFD metrics' synchronising ``compute`` or none does."""
        bad = ~torch.isfinite(student.reshape(student.shape[0], -1)).all(1)
        feats = self._features(torch.nan_to_num(student))  # NaN rows are counted, not used
        bad |= ~torch.isfinite(feats.reshape(feats.shape[0], -1)).all(1).to(bad.device)
        n_bad = global_sum(float(bad.sum()), trainer.world_size, pl_module.device)
        fraction = n_bad / self.num_eval
        pairs = [(name, self.key(leaf)) for name, leaf in (("teacher", "e_gen"), ("empirical", "e_mem"))
                 if name in self._ref]
        values: Dict[str, torch.Tensor] = {}
        if n_bad > 0:
            self._warn_nonfinite(trainer, fraction, "student endpoints", [k for _, k in pairs],
                                 self.key("nonfinite"))
            values.update({k: torch.tensor(math.nan, dtype=torch.float64) for _, k in pairs})
        else:
            for name, key in pairs:
                m = ProbabilityFlowDistance().to(feats.device)  # features already computed: identity here
                m.update(feats, self._ref[name]["features"][shard].to(feats.device))
                values[key] = m.compute()
        values[self.key("nonfinite")] = torch.tensor(fraction, dtype=torch.float64)
        return values

    @staticmethod
    def _all_true(trainer, flag: bool, device=None) -> bool:
        """``flag`` on every rank (a sum all-reduce of the failures; the identity on one process)."""
        device = trainer.strategy.root_device if device is None and trainer.world_size > 1 else device
        return global_sum(0.0 if flag else 1.0, trainer.world_size, device) == 0.0

    # ------------------------------------------------------------------ sample grid (Fig. 1 rows)
    def _log_grid(self, trainer, shard: torch.Tensor, student: torch.Tensor) -> None:
        n = min(self.num_images, len(shard))
        rows = [student[:n].cpu()]
        names = ["student"]
        for name in ("teacher", "empirical"):
            if name in self._ref:
                rows.append(self._ref[name]["endpoints"][shard[:n]])
                names.append(name)
        grid = _image_grid(torch.stack(rows))  # (H', W', C) in [0, 1]
        caption = " / ".join(names) + f" rows, epoch {trainer.current_epoch}"
        logger = trainer.logger
        img = (grid * 255).round().to(torch.uint8).numpy()  # (H, W, C) uint8
        img = img[..., 0] if img.shape[-1] == 1 else img  # grey: (H, W)
        if logger is not None and hasattr(logger, "log_image"):
            logger.log_image(key=self.key("samples"), images=[img], caption=[caption], step=trainer.global_step)
            return
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        root = (getattr(logger, "log_dir", None) if logger is not None else None) or trainer.default_root_dir
        out = os.path.join(root, "pfd_samples" if self.name is None else f"{self.name}_samples")
        os.makedirs(out, exist_ok=True)
        plt.imsave(os.path.join(out, f"epoch_{trainer.current_epoch:04d}.png"), img,
                   cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> Dict[str, Any]:
        return {"history": list(self.history), "cache_keys": dict(self.cache_keys), "num_eval": self.num_eval,
                **self.schedule_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.load_schedule_state(state_dict)
        self.cache_keys = dict(state_dict.get("cache_keys", {}))


def _image_grid(rows: torch.Tensor, pad: int = 1) -> torch.Tensor:
    """(R, n, C, H, W) in [-1, 1] -> one (R*(H+pad)+pad, n*(W+pad)+pad, C) image in [0, 1]."""
    R, n, C, H, W = rows.shape
    x = ((rows.to(torch.float32).nan_to_num(0.0).clamp(-1, 1) + 1) / 2)
    canvas = torch.ones(C, R * (H + pad) + pad, n * (W + pad) + pad)
    for r in range(R):
        for c in range(n):
            top, left = pad + r * (H + pad), pad + c * (W + pad)
            canvas[:, top: top + H, left: left + W] = x[r, c]
    return canvas.permute(1, 2, 0)


def _hparams(obj) -> Dict[str, Any]:
    """An object's saved hyperparameters as a plain dict (empty when it has none)."""
    hp = getattr(obj, "hparams", None)
    try:
        return dict(hp) if hp is not None else {}
    except (TypeError, ValueError):
        return {}


def _first_difference(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[str]:
    """The first of num_steps, sigma_min, sigma_max, rho set differently in ``a`` and ``b``."""
    for arg in _GRID_ARGS:
        if arg in a and arg in b and float(a[arg]) != float(b[arg]):
            return arg
    return None


def _describe_solver(hp: Dict[str, Any], grid: torch.Tensor, sampler: str) -> str:
    """``(heun, num_steps=5, sigma_min=0.002, sigma_max=80, rho=7)`` from the settings, or
    ``(heun, 5 steps, sigma 80 .. 0.002)`` from the grid itself when the settings are unknown."""
    args = ", ".join(f"{a}={hp[a]:g}" for a in _GRID_ARGS if isinstance(hp.get(a), (int, float)))
    if args:
        return f"({sampler}, {args})"
    pos = grid[grid > 0]
    span = f"{len(grid) - 1} steps, sigma {float(pos.max()):.6g} .. {float(pos.min()):.6g}" if len(pos) \
        else "an empty grid"
    return f"({sampler}, {span})"
