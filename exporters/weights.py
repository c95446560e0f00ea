"""Point weights as the graph holds them: folded (batch norm and keep probability, see
:mod:`exporters.fold`) and, on the int8 routes, symmetric per-channel int8 (exporter issue,
"Writing TFLite"). numpy only, apart from reading the torch layers in :func:`prepare_weights`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_sdk.bundle import WEIGHT_ROUTES  # the manifest's weight routes, defined once
from edge_sdk.errors import ConfigError
from exporters.fold import fold_affine, fold_layer, fold_scale
from trainer.layers import BayesNestedLayer
from trainer.models.base import NestedModel

__all__ = ["ChannelQuant", "LayerWeights", "QuantizedTensor", "prepare_weights",
           "quantize_per_channel"]

_INT8_MAX = 127  # symmetric: -128 is never used, so the grid is the same on both sides


# ------------------------------------------------------------------------------- quantization
@dataclass(frozen=True)
class ChannelQuant:
    """Per-channel symmetric int8 parameters of a constant tensor (zero points are all 0)."""

    scale: np.ndarray  # float32, one per channel along ``axis``
    axis: int


@dataclass
class QuantizedTensor:
    """``values * scale`` (broadcast along ``axis``) is what DEQUANTIZE computes, in float32.

    ``exact`` says whether that product equals the target bit for bit (see
    :func:`quantize_per_channel`).
    """

    values: np.ndarray  # int8, in [-127, 127]
    scale: np.ndarray  # float32 [channels]
    axis: int
    exact: bool

    def dequantize(self) -> np.ndarray:
        return self.values.astype(np.float32) * _along(self.scale, self.axis, self.values.ndim)


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _pow2_at_least(x: np.ndarray) -> np.ndarray:
    """The smallest power of two >= x (float64, x > 0), computed exactly (frexp, no log2)."""
    mant, exp = np.frexp(x)  # x = mant * 2^exp, 0.5 <= mant < 1
    return np.ldexp(1.0, np.where(mant == 0.5, exp - 1, exp))


def quantize_per_channel(w: np.ndarray, axis: int, pow2_step: bool = False,
                         channel_scale: np.ndarray | None = None) -> QuantizedTensor:
    """Symmetric int8 per channel along ``axis``: ``w ~ q * step`` with ``|q| <= 127``.

    The step is ``max|w_c| / 127`` (float32), or with ``pow2_step`` the smallest power of two
    with ``max|w_c| / step <= 127``: then any value that is a multiple of the step, e.g. a sum of
    powers of two no finer than it (PWFN's codebook), is represented exactly.

    ``channel_scale`` (float32, one per channel) multiplies the step: the stored scale is
    ``step * channel_scale``. Pass the *unfolded* codebook values as ``w`` and the fold scale
    here, and DEQUANTIZE yields ``float32(w) * channel_scale`` exactly when ``q * step == w``
    (a power-of-two factor commutes with float32 rounding), which is the exporter issue's check
    "int8 x scale == codebook value x fold scale".

    ``exact`` is whether ``q * scale`` (float32, as the runtime computes it) equals the target
    ``float32(w) [* channel_scale]`` for every element. An all-zero channel gets step 1.
    """
    w = np.asarray(w)
    if w.ndim == 0 or not -w.ndim <= axis < w.ndim:
        raise ConfigError(f"axis {axis} is out of range for a weight of shape {w.shape}")
    axis %= w.ndim
    if not np.isfinite(w).all():
        raise ConfigError("cannot quantize a weight with non-finite values")
    channels = w.shape[axis]
    w32 = w.astype(np.float32)
    amax = np.abs(np.moveaxis(w32, axis, 0).reshape(channels, -1)).max(axis=1).astype(np.float64)
    if pow2_step:
        # amax is a float32, so the float64 quotient keeps amax <= 127 * step exact.
        step = np.where(amax > 0, _pow2_at_least(np.where(amax > 0, amax, 1.0) / _INT8_MAX), 1.0)
    else:
        step = np.where(amax > 0, amax / _INT8_MAX, 1.0)
    step = step.astype(np.float32)
    q = np.clip(np.rint(w32 / _along(step, axis, w.ndim)), -_INT8_MAX, _INT8_MAX).astype(np.int8)

    if channel_scale is None:
        scale, target = step, w32
    else:
        cs = np.asarray(channel_scale, dtype=np.float32).reshape(-1)
        if cs.shape != (channels,):
            raise ConfigError(f"channel_scale has {cs.size} entries, expected {channels}")
        scale = step * cs
        target = w32 * _along(cs, axis, w.ndim)
    out = QuantizedTensor(q, scale.astype(np.float32), axis, exact=False)
    out.exact = bool(np.array_equal(out.dequantize(), target))
    return out



# ------------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    """One layer's folded weights as they go into the graph (torch layout).

    ``quant`` is the int8 form (per output channel, axis 0) on the dequantize route and
    ``None`` on the float route; :meth:`effective` is what the graph computes with.
    """

    name: str
    weight: np.ndarray  # folded float32, torch layout
    bias: np.ndarray  # float32 [out]; biases always stay float32 (issue)
    fold_scale: np.ndarray  # float32 [out]
    quant: QuantizedTensor | None
    route: str  # "dequantize" | "hybrid" | "float"

    @property
    def exact(self) -> bool | None:
        return None if self.quant is None else self.quant.exact

    def effective(self) -> np.ndarray:
        return self.weight if self.quant is None else self.quant.dequantize()


def prepare_weights(model: NestedModel, weights: str = "dequantize",
                    pow2_step: bool = False) -> dict[str, LayerWeights]:
    """Fold and (on the dequantize route) quantize every Bayesian layer's point weights.

    ``pow2_step`` is the codebook-exact mode (PWFN point slices): the *unfolded* weights
    (``weight_mu``, which PWFN sets to codebook values) are quantized with a power-of-two step
    times the fold scale, so ``int8 x scale == codebook value x fold scale`` bit for bit; a
    tensor that cannot be exact stays float32 (route ``"float"``, recorded by the caller).
    """
    if weights not in WEIGHT_ROUTES:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_ROUTES)}, got {weights!r}")
    out = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, BayesNestedLayer):
            continue
        w, b = fold_layer(layer)
        fs = fold_scale(layer)
        quant = None
        if weights in ("dequantize", "hybrid"):
            if pow2_step:
                mu = layer.weight_mu.detach().cpu().numpy()
                quant = quantize_per_channel(mu, 0, pow2_step=True, channel_scale=fs)
                if quant.exact:
                    assert np.array_equal(quant.dequantize(), w)  # by construction (fold.py)
                else:
                    quant = None  # cannot be exact: keep float (issue)
            else:
                quant = quantize_per_channel(w, 0)
        route = "float" if quant is None else weights
        if route == "hybrid" and getattr(layer, "depthwise", False):
            route = "dequantize"  # no hybrid depthwise kernel is emitted (exporters.lowering)
        out[name] = LayerWeights(name, w, b, fs, quant, route)
    return out



def with_graph_weights(model: NestedModel, weights: dict[str, LayerWeights]) -> NestedModel:
    """A copy of ``model`` whose torch forward uses exactly the weights a written graph holds
    (each layer's effective, e.g. dequantized int8 x scale, weights unfolded again), so only
    float arithmetic separates it from the interpreter: the reference for "TFLite == torch"."""
    import copy

    import torch

    ref = copy.deepcopy(model)
    for name, layer in ref.named_modules():
        if isinstance(layer, BayesNestedLayer):
            a, _ = fold_affine(layer)
            eff = weights[name].effective().astype(np.float64)
            layer.weight_mu.data = torch.from_numpy(eff / a.reshape((-1,) + (1,) * (eff.ndim - 1)))
    return ref
