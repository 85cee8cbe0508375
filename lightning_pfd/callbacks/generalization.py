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

are logged (values are already synced: float64 sum states reduced over ranks). Every
``image_every_n_epochs`` passes a grid of samples (rows: student, teacher, empirical; columns:
the same seeds, like the paper's Fig. 1) goes to the logger's ``log_image`` or to a PNG file.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Any, Dict, Optional, Sequence

import lightning.pytorch as pl
import torch
from torchmetrics import Metric

from ..cache import cache_dir, hash_key, load_tensor_verified, save_tensor_atomic
from ..diffusion import EmpiricalDenoiser, clamp_sigmas, karras_sigmas, sample_endpoints
from ..diffusion.sampling import SAMPLERS
from ..metrics.descriptors import build_descriptor, descriptor_fingerprint
from ..metrics.pfd import ProbabilityFlowDistance
from ._schedule import ScheduledMonitor

__all__ = ["GeneralizationMonitor"]

DEFAULT_GEN_SEED_OFFSET = 2_000_000
LOSS_TRAIN_SEED_OFFSET = 20_000_000  # frozen (noise, sigma) of the i-th training sample
LOSS_TEST_SEED_OFFSET = 30_000_000  # ... of the i-th held-out sample
_CACHE_VERSION = 1


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
        sampler: "heun" (default, EDM Alg. 1) or "euler"; same for student, teacher and empirical flows.
        sigmas: the sigma grid; None = ``pl_module.sigmas`` if present, else EDM's 18-step grid.
        batch_size: samples per sampler batch (memory knob).
        chunk_size: training-set chunk of the empirical denoiser (memory knob).
        num_loss_samples: how many (fixed, leading) training / held-out samples enter the
            frozen-noise losses; None = all.
        image_every_n_epochs: validation passes between sample grids (0 disables; a grid only on
            a measured pass); image data only.
        num_images: columns of the sample grid.
        use_cache: read/write the on-disk cache (``$LIGHTNING_PFD_CACHE``).
    """

    def __init__(self, num_eval: int = 1024, every_n_epochs: int = 1, descriptor: Any = None,
                 sampler: str = "heun", sigmas: Optional[Sequence[float]] = None, batch_size: int = 256,
                 chunk_size: int = 4096, num_loss_samples: Optional[int] = 1024,
                 image_every_n_epochs: int = 10, num_images: int = 8, use_cache: bool = True):
        super().__init__()
        for name, v, lo in (("num_eval", num_eval, 1), ("every_n_epochs", every_n_epochs, 1),
                            ("batch_size", batch_size, 1), ("chunk_size", chunk_size, 1),
                            ("image_every_n_epochs", image_every_n_epochs, 0), ("num_images", num_images, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {v!r}")
        if num_loss_samples is not None and (not isinstance(num_loss_samples, int) or num_loss_samples < 1):
            raise ValueError(f"num_loss_samples: must be None or an integer >= 1, got {num_loss_samples!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler: unknown {sampler!r}; accepted: {sorted(SAMPLERS)}")
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

    # ------------------------------------------------------------------ setup (once per run)
    @staticmethod
    def _datamodule(trainer: "pl.Trainer"):
        dm = getattr(trainer, "datamodule", None)
        if dm is None or getattr(dm, "train_data", None) is None:
            raise ValueError("GeneralizationMonitor: needs a datamodule exposing `train_data` after setup() "
                             "(pass datamodule=... to the Trainer)")
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
        key = hash_key("pfd-reference", _CACHE_VERSION, name, fingerprint, [int(s) for s in self._seeds],
                       [int(s) for s in shape], self.sampler, grid, descriptor_fingerprint(self.descriptor))
        self.cache_keys[name] = key
        path = cache_dir() / "pfd" / f"{name}_{key[:32]}.pt"
        hit = load_tensor_verified(path, key) if self.use_cache else None
        ok = hit is not None and hit["endpoints"].shape[0] == self.num_eval
        if self._all_true(trainer, ok):  # every rank must take the same branch (collectives below)
            return hit
        shard = self._shard(trainer)
        den = denoiser_fn()
        ends = sample_endpoints(den, self._seeds[shard], shape, sigmas=grid, sampler=self.sampler,
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
        if self.num_eval < trainer.world_size:  # an empty shard would hang the all_gather below
            raise ValueError(f"num_eval: {self.num_eval} is smaller than the world size {trainer.world_size}; "
                             "every rank needs at least one evaluation seed (use num_eval >= world size)")
        if self._ref is not None:
            return
        dm = self._datamodule(trainer)
        if not hasattr(pl_module, "denoiser") or not hasattr(pl_module, "loss_fn"):
            raise ValueError(f"GeneralizationMonitor: {type(pl_module).__name__} has no sigma-space `denoiser` / "
                             "`loss_fn`; PFD compares PF-ODE maps of sigma-space denoisers (DiffusionModule). "
                             "For LevyItoModule use TailMonitor and MemorizationMonitor")
        offset = int(getattr(dm, "gen_seed_offset", DEFAULT_GEN_SEED_OFFSET))
        n_gen = getattr(dm, "n_gen", None)
        if n_gen is not None and self.num_eval > int(n_gen):
            raise ValueError(f"num_eval: {self.num_eval} exceeds the datamodule's reserved evaluation range "
                             f"n_gen = {n_gen} (seeds must stay disjoint from training / test seeds)")
        self._seeds = torch.arange(offset, offset + self.num_eval)
        shape = tuple(dm.train_data.shape[1:])
        grid = self._grid(pl_module)
        self._ref = {}
        teacher = getattr(dm, "teacher", None)
        if teacher is not None:
            fp_fn = getattr(dm, "teacher_fingerprint", None) or getattr(teacher, "fingerprint", None)
            if fp_fn is None:
                raise ValueError("datamodule.teacher: needs a fingerprint() method (it keys the endpoint cache)")
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
        super().setup(trainer, pl_module, stage)
        self._ref, self._seeds = None, None  # a new run may bring new data / teacher: prepare again

    def on_fit_start(self, trainer, pl_module) -> None:
        self._prepare(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._prepare(trainer, pl_module)

    # ------------------------------------------------------------------ every n-th validation pass
    @torch.no_grad()
    def _frozen_loss(self, trainer, pl_module, data: Optional[torch.Tensor],
                     seed_offset: int) -> Optional[torch.Tensor]:
        """Mean per-sample loss with frozen (noise, sigma) per sample (REFERENCE §7), sharded + synced."""
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
        if hasattr(pl_module, "generate") and self.sigmas is None:
            return pl_module.generate(seeds, sampler=self.sampler, batch_size=self.batch_size)
        return sample_endpoints(pl_module.denoiser, seeds, shape, sigmas=self._grid(pl_module),
                                sampler=self.sampler, batch_size=self.batch_size,
                                device=pl_module.device, out_device=pl_module.device)

    @torch.no_grad()
    def _measure_and_log(self, trainer, pl_module) -> None:
        """Called by ScheduledMonitor on due passes (on_validation_epoch_end / on_train_epoch_end)."""
        self._prepare(trainer, pl_module)
        shape = tuple(self._ref["empirical"]["endpoints"].shape[1:])
        shard = self._shard(trainer)
        student = self._student(trainer, pl_module, shard, shape)
        finite = bool(torch.isfinite(student).all())
        feats = self._features(student if finite else torch.nan_to_num(student))  # NaN logged below
        values: Dict[str, torch.Tensor] = {}
        for name, key in (("teacher", "pfd/e_gen"), ("empirical", "pfd/e_mem")):
            if name in self._ref:
                m = ProbabilityFlowDistance().to(feats.device)  # features already computed: identity here
                if len(shard):
                    m.update(feats, self._ref[name]["features"][shard].to(feats.device))
                values[key] = m.compute()
        world_finite = self._all_true(trainer, finite)
        if not world_finite:
            warnings.warn(f"GeneralizationMonitor: non-finite student endpoints at epoch {trainer.current_epoch}; "
                          "logging NaN for pfd/*", RuntimeWarning)
            values = {k: torch.tensor(math.nan, dtype=torch.float64) for k in values}
        dm = trainer.datamodule
        l_train = self._frozen_loss(trainer, pl_module, dm.train_data, LOSS_TRAIN_SEED_OFFSET)
        l_test = self._frozen_loss(trainer, pl_module, getattr(dm, "val_data", None), LOSS_TEST_SEED_OFFSET)
        if l_train is not None:
            values["loss/train_fixed"] = l_train
        if l_test is not None:
            values["loss/test_fixed"] = l_test
            if l_train is not None:
                values["loss/gap"] = l_test - l_train
        for k, v in values.items():
            pl_module.log(k, v, sync_dist=False, on_epoch=True, on_step=False, batch_size=1)
        self.history.append({"epoch": int(trainer.current_epoch), **{k: float(v) for k, v in values.items()}})
        if (self.image_every_n_epochs and self.schedule.index % self.image_every_n_epochs == 0
                and trainer.global_rank == 0 and len(shape) == 3 and shape[0] in (1, 3)):
            self._log_grid(trainer, shard, student)

    @staticmethod
    def _all_true(trainer, flag: bool) -> bool:
        """``flag`` on every rank (a sum all-reduce; the identity on one process)."""
        if trainer.world_size == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([0.0 if flag else 1.0], device=trainer.strategy.root_device)  # NCCL: on GPU
        dist.all_reduce(t)
        return float(t) == 0.0

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
            logger.log_image(key="pfd/samples", images=[img], caption=[caption], step=trainer.global_step)
            return
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        root = (getattr(logger, "log_dir", None) if logger is not None else None) or trainer.default_root_dir
        out = os.path.join(root, "pfd_samples")
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
