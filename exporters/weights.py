"""Point weights as the graph holds them: folded (batch norm and keep probability, see
:mod:`exporters.fold`) and, on the int8 routes, symmetric per-channel int8 (zero points 0, one
float32 scale per output channel; docs/export.md). numpy only, apart from reading the torch
layers in :func:`prepare_weights`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import numpy as np

from edge_sdk.bundle import WEIGHT_ROUTES  # the manifest's weight routes, defined once
from edge_sdk.errors import ConfigError
# one definition of the int8 grid, shared with the device-side materialiser (docs/store.md §3)
from edge_sdk.tflite.quant import QuantizedTensor, quantize_per_channel
from exporters.fold import fold_affine, fold_layer, fold_scale
from trainer.layers import BayesNestedLayer
from trainer.models.base import NestedModel

__all__ = ["ChannelQuant", "LayerWeights", "QuantizedTensor", "prepare_weights",
           "quantize_per_channel"]

# ------------------------------------------------------------------------------- quantization
@dataclass(frozen=True)
class ChannelQuant:
    """Per-channel symmetric int8 parameters of a constant tensor (zero points are all 0)."""

    scale: np.ndarray  # float32, one per channel along ``axis``
    axis: int


# ------------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    """One layer's folded weights as they go into the graph (torch layout).

    ``quant`` is the int8 form (per output channel, axis 0) on the dequantize route and
    ``None`` on the float route; :meth:`effective` is what the graph computes with.
    """

    name: str
    weight: np.ndarray  # folded float32, torch layout
    bias: np.ndarray  # float32 [out]; biases always stay float32
    fold_scale: np.ndarray  # float32 [out]
    quant: QuantizedTensor | None
    route: str  # "dequantize" | "hybrid" | "float"

    @property
    def exact(self) -> bool | None:
        return None if self.quant is None else self.quant.exact

    def effective(self) -> np.ndarray:
        return self.weight if self.quant is None else self.quant.dequantize()


def prepare_weights(model: NestedModel, weights: str = "dequantize",
                    pow2_step: bool = False, sampled: Collection[str] = ()
                    ) -> dict[str, LayerWeights]:
    """Fold and (on the dequantize route) quantize every Bayesian layer's point weights.

    ``pow2_step`` is the codebook-exact mode (PWFN point slices): the *unfolded* weights
    (``weight_mu``, which PWFN sets to codebook values) are quantized with a power-of-two step
    times the fold scale, so ``int8 x scale == codebook value x fold scale`` bit for bit; a
    tensor that cannot be exact stays float32 (route ``"float"``, recorded by the caller).
    ``sampled``: layers holding posterior samples, not codebook values (the head scope's
    stacked classifier): quantized per channel as without ``pow2_step``, so a PWFN head slice
    runs its point slice's backbone bit for bit and its heads on the store route's int8 grid
    (``edge_sdk.store.materialize``: codes for the backbone, ``quantize_per_channel`` for the
    stacked heads; docs/store.md §7).
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
            if pow2_step and name not in sampled:
                mu = layer.weight_mu.detach().cpu().numpy()
                quant = quantize_per_channel(mu, 0, pow2_step=True, channel_scale=fs)
                if quant.exact:
                    assert np.array_equal(quant.dequantize(), w)  # by construction (fold.py)
                else:
                    quant = None  # cannot be exact: keep float
            else:
                quant = quantize_per_channel(w, 0)
        route = "float" if quant is None else weights
        if route == "hybrid" and (getattr(layer, "depthwise", False) or
                                  getattr(layer, "grouped", False)):
            # no hybrid depthwise kernel is emitted, and a grouped conv slices its float filter
            # per group (exporters.lowering)
            route = "dequantize"
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
