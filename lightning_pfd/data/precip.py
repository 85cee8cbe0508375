"""StageIV hourly precipitation (Hurricane Florence 2018): heavy-tailed real fields.

The package ships a copy of ``test_stageiv_xyt.nc`` from Debian's r-cran-stars (Apache-2.0; see
``assets/COPYRIGHT-stageiv_florence.txt``): 23 hourly frames of 118 x 87 pixels in mm/h, 43 %
dry, max 164 mm/h. With only 23 correlated frames, the model trains on seeded random crops
(default 32 x 32). Frames are split in time (default: first 18 for training, last 5 for
validation) so validation crops come from unseen hours.

Transform (training space): y = 2 log1p(p) / log1p(log_max) - 1, so 0 mm/h -> -1 and
``log_max`` mm/h -> +1; ``inverse_transform`` maps samples back to mm/h before computing physical
observables such as the crop maximum. Values below -1 have no preimage (precipitation >= 0) and
become 0 mm/h (dry). Values above +1 are precipitation above ``log_max``, outside the training
range; the inverse is exponential, so y = 3 is already log_max^2 ~ 4e4 mm/h and one such pixel
decides a crop maximum. The **out-of-range policy** says what to do with them:
``out_of_range="keep"`` (default, faithful: extrapolate the transform) or ``"clip"`` (cap at
``log_max``; a documented option, it hides the failure). Whatever the policy,
``out_of_range_fraction`` counts them (pixels above +1 / below -1, samples with a pixel above +1):
report it next to every tail metric.
"""
from __future__ import annotations

import math
from pathlib import Path
import typing
from typing import Literal, Optional, Sequence

import numpy as np
import torch

from ..errors import ConfigError
from ..validation import NonNegativeInt, PositiveFloat, PositiveInt, check_args
from .base import DEFAULT_VALUE_RANGE, TensorDataModule

__all__ = ["PrecipitationDataModule", "load_stageiv", "random_crops", "STAGEIV_PATH",
           "log1p_transform", "log1p_inverse", "out_of_range_fraction", "OUT_OF_RANGE_POLICIES"]

#: what ``log1p_inverse`` does with training-space values above +1 (precipitation > log_max)
#: what :func:`log1p_inverse` does above +1 (its docstring)
OutOfRange = Literal["keep", "clip"]
OUT_OF_RANGE_POLICIES = typing.get_args(OutOfRange)

STAGEIV_PATH = Path(__file__).resolve().parent / "assets" / "stageiv_florence.nc"
STAGEIV_VARIABLE = "Total_precipitation_surface_1_Hour_Accumulation"


def load_stageiv(path: Optional[str] = None) -> torch.Tensor:
    """The precipitation frames (T, H, W) in mm/h as float32 (NaN -> 0, negatives -> 0)."""
    from scipy.io import netcdf_file

    p = Path(path) if path is not None else STAGEIV_PATH
    if not p.exists():
        raise ValueError(f"path: no netCDF file at {str(p)!r} (expected the StageIV file with "
                         f"variable {STAGEIV_VARIABLE!r})")
    with netcdf_file(str(p), "r", mmap=False) as f:
        if STAGEIV_VARIABLE not in f.variables:
            raise ValueError(f"path: {str(p)!r} has no variable {STAGEIV_VARIABLE!r}; "
                             f"found {sorted(f.variables)}")
        x = np.array(f.variables[STAGEIV_VARIABLE].data, dtype=np.float32)
    x = np.nan_to_num(x, nan=0.0).clip(min=0.0)
    return torch.from_numpy(x)


def random_crops(frames: torch.Tensor, n: int, size: int, seed: int) -> torch.Tensor:
    """``n`` seeded random ``size`` x ``size`` crops of frames (T, H, W) -> (n, 1, size, size)."""
    T, H, W = frames.shape
    if not 1 <= size <= min(H, W):
        raise ValueError(f"crop_size: must lie in [1, {min(H, W)}], got {size}")
    g = torch.Generator().manual_seed(int(seed))
    f = torch.randint(T, (n,), generator=g)
    i0 = torch.randint(H - size + 1, (n,), generator=g)
    j0 = torch.randint(W - size + 1, (n,), generator=g)
    r = torch.arange(size)
    rows = (i0[:, None] + r)[:, :, None]
    cols = (j0[:, None] + r)[:, None, :]
    return frames[f[:, None, None], rows, cols].unsqueeze(1).contiguous()


def log1p_transform(p: torch.Tensor, log_max: float) -> torch.Tensor:
    """mm/h -> training space: 2 log1p(p)/log1p(log_max) - 1."""
    return 2.0 * torch.log1p(p.clamp_min(0)) / math.log1p(log_max) - 1.0


def log1p_inverse(y: torch.Tensor, log_max: float, out_of_range: OutOfRange = "keep") -> torch.Tensor:
    """Training space -> mm/h (float64): expm1((max(y, -1) + 1)/2 log1p(log_max)).

    ``out_of_range``: "keep" (default) extrapolates above +1 (faithful: y = 1 + d gives
    (1 + log_max)^(1 + d/2) - 1 mm/h); "clip" caps y at +1, i.e. at ``log_max`` mm/h. Below -1
    is 0 mm/h under both policies (no precipitation below 0)."""
    check_args(log1p_inverse, {"out_of_range": out_of_range})
    y = torch.as_tensor(y).to(torch.float64)
    y = y.clamp_min(-1.0) if out_of_range == "keep" else y.clamp(-1.0, 1.0)
    return torch.expm1((y + 1.0) * 0.5 * math.log1p(log_max))


def out_of_range_fraction(y: torch.Tensor, lo: float = -1.0, hi: float = 1.0) -> dict:
    """How much of a batch (B, ...) lies outside the training range [lo, hi] (training space).

    Returns floats: ``pixels_above`` / ``pixels_below`` (fraction of all values > hi / < lo),
    ``samples_above`` (fraction of samples with at least one value > hi), ``nonfinite``
    (fraction of non-finite values, counted in neither), ``max`` (largest finite value) and
    ``n_pixels``. For precipitation, [-1, 1] = [0, log_max] mm/h."""
    if isinstance(lo, bool) or isinstance(hi, bool) or not (
            isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi):
        raise ConfigError("lo, hi", "need numbers lo < hi", value=(lo, hi))
    y = torch.as_tensor(y).to(torch.float64)
    if y.ndim < 1 or y.shape[0] == 0:
        raise ConfigError("y", "need a non-empty batch (B, ...)",
                          value=tuple(y.shape))
    flat = y.reshape(y.shape[0], -1)
    fin = torch.isfinite(flat)
    above, below = (flat > hi) & fin, (flat < lo) & fin
    n = flat.numel()
    return {"pixels_above": float(above.sum()) / n, "pixels_below": float(below.sum()) / n,
            "samples_above": float(above.any(1).double().mean()),
            "nonfinite": float((~fin).sum()) / n,
            "max": float(flat[fin].max()) if bool(fin.any()) else float("nan"),
            "n_pixels": int(n)}


class PrecipitationDataModule(TensorDataModule):
    """Random crops of StageIV precipitation in log1p space (see the module docstring).

    Args:
        crop_size: side of the square crops (<= 87).
        n_train, n_val: number of training / validation crops.
        train_frames, val_frames: frame indices of each split (default: 0..17 / 18..22).
        log_max: precipitation (mm/h) mapped to +1 by the transform.
        crop_seed: seeds the crop positions (validation uses crop_seed + 1).
        path: a StageIV netCDF file (default: the shipped copy).
        value_range: declared range of the transformed crops (default [-1, 1]: 0 mm/h is -1,
            ``log_max`` mm/h is +1; the shipped data peak at 164 mm/h, inside the default
            ``log_max`` of 200). Values above +1 mean precipitation above ``log_max``.
        out_of_range: default policy of ``inverse_transform`` for generated values above +1:
            "keep" (faithful extrapolation, default) or "clip" (cap at ``log_max``).
    """

    #: unit of the fields after :meth:`inverse_transform` (observables, figures)
    physical_unit = "mm/h"

    def __init__(self, crop_size: PositiveInt = 32, n_train: PositiveInt = 2048, n_val: NonNegativeInt = 512,
                 train_frames: Optional[Sequence[int]] = None,
                 val_frames: Optional[Sequence[int]] = None, log_max: PositiveFloat = 200.0,
                 crop_seed: int = 0, path: Optional[str] = None, batch_size: PositiveInt = 64,
                 val_batch_size: Optional[PositiveInt] = None, num_workers: NonNegativeInt = 0,
                 samples_per_epoch: Optional[PositiveInt] = None, seed: int = 0,
                 value_range: Optional[tuple[float, float]] = DEFAULT_VALUE_RANGE,
                 out_of_range: OutOfRange = "keep"):
        check_args(PrecipitationDataModule.__init__, locals())
        if crop_size > 87:
            raise ValueError(f"crop_size: must lie in [1, 87] (the grid is 118 x 87), got {crop_size}")
        train_frames = list(range(18)) if train_frames is None else [int(i) for i in train_frames]
        val_frames = list(range(18, 23)) if val_frames is None else [int(i) for i in val_frames]
        for name, fr in (("train_frames", train_frames), ("val_frames", val_frames)):
            if not fr or any(not 0 <= i < 23 for i in fr):
                raise ValueError(f"{name}: must be a non-empty list of frame indices in [0, 22], got {fr}")
        if path is not None and not Path(path).exists():
            raise ValueError(f"path: no netCDF file at {path!r}")
        super().__init__(batch_size=batch_size, val_batch_size=val_batch_size,
                         num_workers=num_workers, samples_per_epoch=samples_per_epoch,
                         n_train=n_train, seed=seed, value_range=value_range)
        self.save_hyperparameters()
        self.crop_size, self.n_val, self.log_max = int(crop_size), int(n_val), float(log_max)
        self.train_frames, self.val_frames = train_frames, val_frames
        self.crop_seed, self.path = int(crop_seed), path
        self.out_of_range = out_of_range

    def available_train(self) -> int:
        return self.n_train

    def range_hint(self) -> Optional[str]:
        """Values above +1 are precipitation above ``log_max``: raising it fixes the range."""
        return (f"the transform maps log_max = {self.log_max:g} mm/h to +1: raise log_max above "
                "the data's maximum precipitation")

    def load_splits(self):
        frames = load_stageiv(self.path)
        tr = random_crops(frames[self.train_frames], self.n_train, self.crop_size, self.crop_seed)
        x_tr = self.transform(tr)
        x_va = None
        if self.n_val > 0:
            va = random_crops(frames[self.val_frames], self.n_val, self.crop_size, self.crop_seed + 1)
            x_va = self.transform(va)
        return x_tr, None, x_va, None

    def transform(self, p: torch.Tensor) -> torch.Tensor:
        """mm/h -> training space (float32)."""
        return log1p_transform(p, self.log_max).to(torch.float32)

    def inverse_transform(self, y: torch.Tensor, out_of_range: Optional[str] = None) -> torch.Tensor:
        """Training space -> mm/h (float64), for physical observables; ``out_of_range``
        (None = the module's policy): "keep" or "clip" values above +1 (see module doc)."""
        return log1p_inverse(y, self.log_max, self.out_of_range if out_of_range is None
                             else out_of_range)

    def out_of_range_stats(self, y: torch.Tensor) -> dict:
        """``out_of_range_fraction`` of generated samples against the transform's range [-1, 1]
        (= [0, log_max] mm/h), whatever the inverse-transform policy."""
        return out_of_range_fraction(y, -1.0, 1.0)
