"""Teacher-student distillation data (PFD paper App. C.3; usage in docs/data.md).

A teacher denoiser (an analytic Gaussian mixture or a trained ``DiffusionModule`` checkpoint)
defines p_data. Three disjoint seed ranges give three noise sets x_T = sigma_max * z(seed):
- x_train,T: seeds [train_seed_offset, + n_train)  ->  training set  Phi_teacher(x_train,T)  (N)
- x_test,T : seeds [test_seed_offset,  + n_test)   ->  test set      Phi_teacher(x_test,T)   (M)
- x_gen,T  : seeds [gen_seed_offset,   + n_gen)    ->  reserved for evaluation (E_gen, E_mem)
All three use the same solver, one :class:`~lightning_pfd.diffusion.sampling.SamplerSettings`
(Heun on EDM's grid, 18 steps by default; ``sampler_settings``). Endpoints are cached on disk
(``lightning_pfd.cache``) under a key hashing the teacher's fingerprint, the seed range, the
sampler and the sigma grid, so a second run makes no teacher call.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ..cache import cache_dir, hash_key, load_tensor_verified, save_tensor_atomic
from ..diffusion import GaussianDenoiser, GaussianMixtureDenoiser, clamp_sigmas
from ..diffusion.sampling import SamplerSettings
from ..errors import MissingFileError
from ..validation import NonNegativeInt, PositiveInt, check_args
from .base import TensorDataModule, _check_choice
from .gmm import check_disjoint_ranges

__all__ = ["TeacherDistillationDataModule", "cached_endpoints", "fit_digits_gmm", "file_sha256",
           "ANALYTIC_TEACHERS"]

ANALYTIC_TEACHERS = ("gmm_digits",)
_ENDPOINT_VERSION = 1


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fit_digits_gmm(n_components: PositiveInt = 10, seed: int = 0, reg_covar: float = 1e-3,
                   as_image: bool = False, use_cache: bool = True) -> GaussianMixtureDenoiser:
    """An analytic teacher: a full-covariance GMM fitted (EM, seeded) to all 1797 UCI digits as
    64-d vectors in [-1, 1]; ``as_image`` gives it the data shape (1, 8, 8). The fit is cached."""
    import sklearn

    from .digits import load_digits_tensor

    check_args(fit_digits_gmm, locals())
    if n_components > 1797:  # one component per digit image at most
        raise ValueError(f"n_components: must be an integer in [1, 1797], got {n_components!r}")
    shape = (1, 8, 8) if as_image else (64,)
    key = hash_key("gmm_digits", 1, n_components, seed, float(reg_covar), sklearn.__version__)
    path = cache_dir() / "teachers" / f"gmm_digits_{key[:32]}.pt"
    params = load_tensor_verified(path, key) if use_cache else None
    if params is None:
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency

        x, _ = load_digits_tensor()
        # single-threaded BLAS: fast for this size (multi-threaded EM was ~20x slower on a busy
        # 2-core machine) and independent of the core count, so every rank fits the same GMM
        with threadpool_limits(limits=1):
            gmm = GaussianMixtureDenoiser.fit(x.reshape(len(x), -1).double(), n_components,
                                              reg_covar=reg_covar, seed=seed, shape=(64,))
        params = {"weights": gmm.weights, "means": gmm.means, "covs": gmm.covs}
        if use_cache:
            save_tensor_atomic(path, params, key)
    return GaussianMixtureDenoiser(params["weights"], params["means"], params["covs"], shape=shape)


def cached_endpoints(denoiser, fingerprint: str, seed_offset: int, n: int, shape: Sequence[int],
                     settings: SamplerSettings, batch_size: PositiveInt = 256, device=None,
                     use_cache: bool = True, tag: str = "endpoints") -> torch.Tensor:
    """Phi_denoiser(x_T) for seeds [seed_offset, seed_offset + n), float64 on CPU, cached on disk.

    The key hashes ``fingerprint`` (it must identify the denoiser), the seed range, the data
    shape, the sampler, the (clamped) sigma grid and -- when not fp32 -- the precision of
    ``settings``. A missing or corrupted cache file is recomputed and rewritten atomically.
    """
    sigmas = settings.sigmas(denoiser)
    precision = [] if settings.precision == "fp32" else [settings.precision]  # fp32 keys as before
    key = hash_key(tag, _ENDPOINT_VERSION, fingerprint, int(seed_offset), int(n),
                   [int(s) for s in shape], str(settings.sampler), sigmas, *precision)
    path = cache_dir() / "endpoints" / f"{tag}_{key[:32]}.pt"
    if use_cache:
        hit = load_tensor_verified(path, key)
        if hit is not None and tuple(hit["x"].shape) == (n, *shape):
            return hit["x"]
    seeds = torch.arange(int(seed_offset), int(seed_offset) + int(n))
    x = settings.sample(denoiser, seeds, shape, batch_size=batch_size, device=device, out_device="cpu")
    if use_cache:
        save_tensor_atomic(path, {"x": x}, key)
    return x


def _resolve_device(device: Optional[str]) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class TeacherDistillationDataModule(TensorDataModule):
    """Training / test sets = endpoints of a teacher's PF-ODE on disjoint seed ranges (App. C.3).

    Args:
        teacher: ``"gmm_digits"`` (default when no ``teacher_ckpt``: a GMM with ``n_components``
            fitted on UCI digits), a dict of GMM parameters ``{weights, means, covs[, shape]}`` or
            Gaussian parameters ``{mean, cov[, shape]}``, or a denoiser object ``D(x, sigma)``
            with a ``fingerprint()`` method (Python API only).
        teacher_ckpt: path of a ``DiffusionModule`` checkpoint; its EMA ``.denoiser`` is the
            teacher and its fingerprint is the sha256 of the file.
        teacher_load_kwargs: extra arguments of ``DiffusionModule.load_from_checkpoint``, e.g.
            ``{"net": MLPNet(...)}`` for a checkpoint written outside LightningCLI (whose
            hyperparameters do not record the network).
        n_components, fit_seed, reg_covar, digits_as_image: the ``gmm_digits`` fit.
        n_train, n_test, n_gen: sizes N, M of the training and test sets, and of the evaluation
            range reserved for x_gen,T (not generated here; see ``gen_seeds``).
        train_seed_offset, test_seed_offset, gen_seed_offset: starts of the three disjoint ranges.
        num_steps, sigma_min, sigma_max, rho, sampler: the teacher's PF-ODE solver (Heun-18),
            kept as ``sampler_settings``.
        gen_batch_size, device: batching and device of the endpoint generation ("auto": CUDA
            if available).
        data_shape: sample shape, needed only for a denoiser object without ``shape``.
        use_cache: read / write the on-disk endpoint cache.
        value_range: declared range of the endpoints; default None (only the finite-values
            check, which catches a diverged teacher): the endpoints' scale is the teacher's, not
            a normalisation choice. Teachers of [-1, 1] data overshoot it (gmm_digits with Heun-18:
            |x| up to ~3.1; with num_steps=3: ~14).
    """

    def __init__(self, teacher: Any = None, teacher_ckpt: Optional[str] = None,
                 teacher_load_kwargs: Optional[dict] = None,
                 n_components: PositiveInt = 10, fit_seed: int = 0, reg_covar: float = 1e-3,
                 digits_as_image: bool = False, n_train: PositiveInt = 64, n_test: PositiveInt = 1024,
                 n_gen: PositiveInt = 10_000, train_seed_offset: NonNegativeInt = 0, test_seed_offset: NonNegativeInt = 1_000_000,
                 gen_seed_offset: NonNegativeInt = 2_000_000, num_steps: int = 18, sigma_min: float = 0.002,
                 sigma_max: float = 80.0, rho: float = 7.0, sampler: str = "heun",
                 gen_batch_size: PositiveInt = 256, device: Optional[str] = None,
                 data_shape: Optional[list[int]] = None, use_cache: bool = True,
                 batch_size: PositiveInt = 128, val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = None):
        # ---- validate everything before any work -----------------------------------------
        check_args(TeacherDistillationDataModule.__init__, locals())
        check_disjoint_ranges(("train_seed_offset", train_seed_offset, "n_train", n_train),
                              ("test_seed_offset", test_seed_offset, "n_test", n_test),
                              ("gen_seed_offset", gen_seed_offset, "n_gen", n_gen))
        settings = SamplerSettings(sampler=sampler, num_steps=num_steps, sigma_min=sigma_min,
                                   sigma_max=sigma_max, rho=rho)
        if teacher is not None and teacher_ckpt is not None:
            raise ValueError("teacher, teacher_ckpt: give one of them, not both")
        if teacher_load_kwargs is not None and teacher_ckpt is None:
            raise ValueError("teacher_load_kwargs: only used with teacher_ckpt")
        if teacher_ckpt is not None:
            if not Path(teacher_ckpt).is_file():
                raise MissingFileError("teacher_ckpt", teacher_ckpt, "a checkpoint file")
        elif teacher is None:
            teacher = "gmm_digits"
        if isinstance(teacher, str):
            _check_choice("teacher", teacher, ANALYTIC_TEACHERS)
            if n_components > 1797:  # the digits the GMM teacher is fitted to
                raise ValueError(f"n_components: must be an integer in [1, 1797], got {n_components!r}")
        elif isinstance(teacher, dict):
            keys = set(teacher) - {"shape"}
            if keys not in ({"weights", "means", "covs"}, {"mean", "cov"}):
                raise ValueError("teacher: a dict must hold GMM parameters {weights, means, covs} or "
                                 f"Gaussian parameters {{mean, cov}} (+ optional shape), got {sorted(teacher)}")
        elif teacher is not None:
            if not callable(teacher) or not callable(getattr(teacher, "fingerprint", None)):
                raise ValueError("teacher: a denoiser object must be callable D(x, sigma) and have a "
                                 "fingerprint() method (it keys the endpoint cache)")
            if data_shape is None and getattr(teacher, "shape", None) is None:
                raise ValueError("data_shape: required for a teacher object without a `shape` attribute")
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size, num_workers=num_workers,
                         samples_per_epoch=samples_per_epoch, n_train=n_train, seed=seed,
                         value_range=value_range)
        ignore = ["teacher_load_kwargs"]
        if not (teacher is None or isinstance(teacher, (str, dict))):
            ignore.append("teacher")
        self.save_hyperparameters(ignore=ignore)
        self._teacher_spec, self.teacher_ckpt = teacher, teacher_ckpt
        self.teacher_load_kwargs = dict(teacher_load_kwargs or {})
        self.n_components, self.fit_seed, self.reg_covar = n_components, fit_seed, reg_covar
        self.digits_as_image = digits_as_image
        self.n_test, self.n_gen = n_test, n_gen
        self.train_seed_offset, self.test_seed_offset = train_seed_offset, test_seed_offset
        self.gen_seed_offset = gen_seed_offset
        self.sampler_settings = settings
        self.num_steps, self.sampler = num_steps, sampler
        self.teacher_sigmas = settings.sigmas()  # clamped to the teacher's range once it is built
        self.gen_batch_size, self.device, self.use_cache = gen_batch_size, device, use_cache
        self._data_shape_arg = None if data_shape is None else tuple(int(d) for d in data_shape)
        self.teacher = None
        self._teacher_fp: Optional[str] = None

    # ---- seeds -------------------------------------------------------------------------------
    @property
    def train_seeds(self) -> torch.Tensor:
        return torch.arange(self.train_seed_offset, self.train_seed_offset + self.n_train)

    @property
    def test_seeds(self) -> torch.Tensor:
        return torch.arange(self.test_seed_offset, self.test_seed_offset + self.n_test)

    @property
    def gen_seeds(self) -> torch.Tensor:
        """The evaluation range x_gen,T (disjoint from the training and test seeds)."""
        return torch.arange(self.gen_seed_offset, self.gen_seed_offset + self.n_gen)

    # ---- teacher -----------------------------------------------------------------------------
    def _load_checkpoint_teacher(self):
        from ..modules.diffusion import DiffusionModule  # lazy: modules import Lightning glue

        try:
            module = DiffusionModule.load_from_checkpoint(self.teacher_ckpt, map_location="cpu",
                                                          **self.teacher_load_kwargs)
        except Exception as e:
            hint = (" (the checkpoint does not record the network: pass teacher_load_kwargs="
                    "{'net': <the same architecture>})" if "net" in str(e) else "")
            raise RuntimeError(f"teacher_ckpt: could not load DiffusionModule from "
                               f"{self.teacher_ckpt!r}: {e}{hint}") from e
        den = module.denoiser.eval().requires_grad_(False)
        fp = "ckpt-" + file_sha256(self.teacher_ckpt)
        den.fingerprint = lambda: fp  # a plain attribute on the module instance
        return den, tuple(module.data_shape)

    def build_teacher(self):
        """Build (once) and return the teacher denoiser; sets ``data_shape`` and ``teacher_sigmas``."""
        if self.teacher is not None:
            return self.teacher
        spec = self._teacher_spec
        if self.teacher_ckpt is not None:
            teacher, shape = self._load_checkpoint_teacher()
        elif isinstance(spec, str):  # "gmm_digits"
            teacher = fit_digits_gmm(self.n_components, self.fit_seed, self.reg_covar,
                                     as_image=self.digits_as_image, use_cache=self.use_cache)
            shape = teacher.shape
        elif isinstance(spec, dict):
            shape = spec.get("shape")
            if "weights" in spec:
                teacher = GaussianMixtureDenoiser(spec["weights"], spec["means"], spec["covs"], shape=shape)
            else:
                teacher = GaussianDenoiser(spec["mean"], spec["cov"], shape=shape)
            shape = teacher.shape
        else:
            teacher = spec
            shape = self._data_shape_arg or tuple(teacher.shape)
        if self._data_shape_arg is not None and tuple(self._data_shape_arg) != tuple(shape):
            raise ValueError(f"data_shape: {self._data_shape_arg} differs from the teacher's {tuple(shape)}")
        self.teacher, self.data_shape = teacher, tuple(shape)
        self.teacher_sigmas = clamp_sigmas(self.teacher_sigmas, teacher)
        self._teacher_fp = str(teacher.fingerprint())
        return teacher

    def teacher_fingerprint(self) -> str:
        self.build_teacher()
        return self._teacher_fp

    def teacher_endpoints(self, seed_offset: int, n: int, tag: str = "teacher") -> torch.Tensor:
        """Cached teacher endpoints Phi_teacher(x_T) for seeds [seed_offset, + n), float64 CPU."""
        teacher = self.build_teacher()
        device = None
        if isinstance(teacher, nn.Module):
            device = _resolve_device(self.device)
            teacher.to(device)
        try:
            return cached_endpoints(teacher, self._teacher_fp, seed_offset, n, self.data_shape,
                                    self.sampler_settings, self.gen_batch_size,
                                    device=device, use_cache=self.use_cache, tag=tag)
        finally:
            if isinstance(teacher, nn.Module):
                teacher.to("cpu")

    # ---- Lightning hooks ---------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Local rank 0: generate and cache the training and test sets (other ranks then load)."""
        self.teacher_endpoints(self.train_seed_offset, self.n_train)
        self.teacher_endpoints(self.test_seed_offset, self.n_test)

    def load_splits(self):
        x_train = self.teacher_endpoints(self.train_seed_offset, self.n_train)
        x_test = self.teacher_endpoints(self.test_seed_offset, self.n_test)
        self.train_data64, self.val_data64 = x_train, x_test  # float64 originals
        return x_train, None, x_test, None
