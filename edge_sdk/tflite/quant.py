"""Symmetric per-channel int8 quantization of constant tensors (numpy only): the one definition
the exporter (``exporters.weights``) and the device-side materialiser
(:mod:`edge_sdk.store.materialize`, docs/store.md §3 step 2) share, so a slice materialised on
the device quantizes exactly as the exporter's files did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError

__all__ = ["INT8_MAX", "QuantizedTensor", "along", "quantize_per_channel"]

INT8_MAX = 127  # symmetric: -128 is never used, so the grid is the same on both sides


@dataclass
class QuantizedTensor:
    """``values * scale`` (broadcast along ``axis``) is what DEQUANTIZE computes, in float32.

    ``exact`` says whether that product equals the target bit for bit (see
    :func:`quantize_per_channel`).
    """

    values: npt.NDArray[np.int8]  # in [-127, 127]
    scale: npt.NDArray[np.float32]  # [channels]
    axis: int
    exact: bool

    def dequantize(self) -> npt.NDArray[np.float32]:
        return self.values.astype(np.float32) * along(self.scale, self.axis, self.values.ndim)


_S = TypeVar("_S", bound=np.generic)


def along(v: npt.NDArray[_S], axis: int, ndim: int) -> npt.NDArray[_S]:
    """``v`` (one value per channel) shaped to broadcast along ``axis`` of a rank-``ndim`` array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _pow2_at_least(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The smallest power of two >= x (float64, x > 0), computed exactly (frexp, no log2)."""
    mant, exp = np.frexp(x)  # x = mant * 2^exp, 0.5 <= mant < 1
    pow2: npt.NDArray[np.float64] = np.ldexp(1.0, np.where(mant == 0.5, exp - 1, exp))
    return pow2


def quantize_per_channel(w: npt.ArrayLike, axis: int, pow2_step: bool = False,
                         channel_scale: npt.ArrayLike | None = None) -> QuantizedTensor:
    """Symmetric int8 per channel along ``axis``: ``w ~ q * step`` with ``|q| <= 127``.

    The step is ``max|w_c| / 127`` (float32), or with ``pow2_step`` the smallest power of two
    with ``max|w_c| / step <= 127``: then any value that is a multiple of the step, e.g. a sum of
    powers of two no finer than it (PWFN's codebook), is represented exactly.

    ``channel_scale`` (float32, one per channel) multiplies the step: the stored scale is
    ``step * channel_scale``. Pass the *unfolded* codebook values as ``w`` and the fold scale
    here, and DEQUANTIZE yields ``float32(w) * channel_scale`` exactly when ``q * step == w``
    (a power-of-two factor commutes with float32 rounding), which is the exporter's check
    "int8 x scale == codebook value x fold scale".

    ``exact`` is whether ``q * scale`` (float32, as the runtime computes it) equals the target
    ``float32(w) [* channel_scale]`` for every element. An all-zero channel gets step 1.
    """
    w = np.asarray(w)
    if w.ndim == 0 or not -w.ndim <= axis < w.ndim:
        raise ConfigError(f"axis {axis} is out of range for a weight of shape {w.shape}")
    axis %= w.ndim
    # a float32 weight (what materialisation passes) is checked through amax below instead (a
    # max propagates NaN and inf): one pass over the weight fewer, the same refusals
    if w.dtype != np.float32 and not np.isfinite(w).all():
        raise ConfigError("cannot quantize a weight with non-finite values")
    channels = w.shape[axis]
    w32 = w.astype(np.float32, copy=False)  # only read below: no copy of a float32 weight
    buf = np.abs(w32)  # scratch: |w|, then the codes, then the dequantized weight
    amax = np.moveaxis(buf, axis, 0).reshape(channels, -1).max(axis=1).astype(np.float64) \
        if w32.size else np.zeros(channels)
    if w.dtype == np.float32 and not np.isfinite(amax).all():
        raise ConfigError("cannot quantize a weight with non-finite values")
    if pow2_step:
        # amax is a float32, so the float64 quotient keeps amax <= 127 * step exact.
        step = np.where(amax > 0, _pow2_at_least(np.where(amax > 0, amax, 1.0) / INT8_MAX), 1.0)
    else:
        step = np.where(amax > 0, amax / INT8_MAX, 1.0)
    step = step.astype(np.float32)
    np.divide(w32, along(step, axis, w.ndim), out=buf)
    np.rint(buf, out=buf)
    np.clip(buf, -INT8_MAX, INT8_MAX, out=buf)
    q = buf.astype(np.int8)

    if channel_scale is None:
        scale, target = step, w32
    else:
        cs = np.asarray(channel_scale, dtype=np.float32).reshape(-1)
        if cs.shape != (channels,):
            raise ConfigError(f"channel_scale has {cs.size} entries, expected {channels}")
        scale = step * cs
        target = w32 * along(cs, axis, w.ndim)
    out = QuantizedTensor(q, scale.astype(np.float32), axis, exact=False)
    # out.dequantize() (int8 -> float32 is exact, then the one float32 multiply), into buf
    np.multiply(q, along(out.scale, axis, w.ndim), out=buf, dtype=np.float32)
    out.exact = bool(np.array_equal(buf, target))
    return out
