"""Equality to rounding: what the tests assert across batch sizes, process counts and CPU models.

Bit-equality holds only where the same kernels run on the same shapes (one process, same batch
size: a rerun, a resume). A matmul over 13 rows and one over 7 rows may take different BLAS kernels
(MKL on Intel picks by shape and ISA; OpenBLAS on AMD differs again), so results computed in other
batch sizes or by another number of processes agree to rounding only. The tolerance is relative to
the largest magnitude of the expected tensor (elements near zero would make an element-wise
relative test meaningless):

* float64: ``1e-12`` relative (measured across MKL/OpenBLAS and 1 vs 2 processes: ~1e-14);
* float32: ``64 * eps`` (~7.6e-6) relative; bfloat16/float16: ``64 * eps`` of that dtype.
"""
from __future__ import annotations

import torch

FLOAT64_RTOL = 1e-12


def rounding_rtol(dtype: torch.dtype) -> float:
    """The relative tolerance for "equal to rounding" in ``dtype`` (see the module docstring)."""
    if dtype == torch.float64:
        return FLOAT64_RTOL
    return 64.0 * torch.finfo(dtype).eps


def assert_equal_to_rounding(actual: torch.Tensor, expected: torch.Tensor, *, equal_nan: bool = False,
                             msg: str = "") -> None:
    """``actual`` equals ``expected`` up to rounding: same shape and dtype, NaN where ``expected``
    is NaN (when ``equal_nan``), and ``|a - e| <= rtol * max|e|`` elsewhere."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (msg, actual.shape, expected.shape,
                                                                               actual.dtype, expected.dtype)
    nan = expected.isnan()
    if equal_nan:
        assert torch.equal(actual.isnan(), nan), (msg, "NaN positions differ")
    finite = expected[~nan].double() if equal_nan else expected.double()
    got = actual[~nan].double() if equal_nan else actual.double()
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    tol = rounding_rtol(expected.dtype) * max(scale, 1e-300)
    err = float((got - finite).abs().max()) if finite.numel() else 0.0
    assert err <= tol, f"{msg}: max |difference| {err:.3g} > {tol:.3g} ({rounding_rtol(expected.dtype):g} x {scale:.3g})"
