"""Fold a truncated layer's batch norm and keep-probability scale into its conv/linear weights.

A truncated :class:`trainer.layers.BayesNestedLayer` computes, per output channel c (eval mode)::

    y_c = act(bn_c(op(x, W)_c + b_c)) * s_c

with ``bn_c(z) = gamma_c (z - mean_c) / sqrt(var_c + eps) + beta_c`` (running statistics) and
``s_c`` the kept channel's keep probability (``out_scale``; BN³ App. 8.2). ReLU is
positive-homogeneous, so for ``s_c >= 0`` the scale moves inside the activation,
``relu(z) * s = relu(s * z)``, and the whole affine map folds into the op::

    y_c = act(a_c * op(x, W)_c + t_c) = act(op(x, a_c W)_c + t_c)
    a_c = s_c gamma_c / sqrt(var_c + eps)            (the "fold scale")
    t_c = s_c (gamma_c (b_c - mean_c) / sqrt(var_c + eps) + beta_c)

ReLU6 is not homogeneous (``relu6(z) * s != relu6(s z)``), so a relu6 layer with an
``out_scale`` is refused; the trainer never builds one (a masked block must use ReLU).

The fold scale is exposed on its own because the PWFN exporter checks that a folded weight is
exactly ``codebook value x fold scale`` (docs/export.md, "Weights stay on the codebook"): the
float32 folded weight is therefore computed as ``float32(W) * float32(a)`` in float32, the
same product the int8 route reproduces with a power-of-two step times ``a``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedLayer

__all__ = ["fold_affine", "fold_layer", "fold_scale"]


def _np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def fold_affine(layer: BayesNestedLayer) -> tuple[np.ndarray, np.ndarray]:
    """The per-output-channel affine ``(a, t)`` (float64) with ``layer(x) = act(a * op(x, W) + t)``.

    Raises :class:`ConfigError` (a ``ValueError``) for a combination that does not fold:
    an ``out_scale`` on a non-homogeneous activation (relu6), a negative ``out_scale`` before a
    ReLU, a batch norm without running statistics, or a layer that is still nested (masks are
    sampled, not folded: truncate the model first).
    """
    name = type(layer).__name__
    if not isinstance(layer, BayesNestedLayer):
        raise ConfigError(f"fold_layer expects a BayesNestedLayer, got {name}")
    if layer.ordering is not None:
        raise ConfigError(f"{name} is still nested (its width is sampled by an ordering unit); "
                          "fold a truncated model: model.truncate(width)")
    channels = layer.out_channels
    scale = np.ones(channels)
    shift = np.zeros(channels) if layer.bias is None else _np64(layer.bias)

    bn = layer.bn
    if bn is not None:
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(f"{name}.bn must be a torch batch norm, got {type(bn).__name__}")
        if bn.running_mean is None or bn.running_var is None:
            raise ConfigError(f"{name}.bn has no running statistics (track_running_stats=False); "
                              "only eval-mode batch norm with running statistics folds")
        inv = 1.0 / np.sqrt(_np64(bn.running_var) + bn.eps)
        gamma = np.ones(channels) if bn.weight is None else _np64(bn.weight)
        beta = np.zeros(channels) if bn.bias is None else _np64(bn.bias)
        scale = gamma * inv
        shift = (shift - _np64(bn.running_mean)) * scale + beta

    if layer.out_scale is not None:
        s = _np64(layer.out_scale)
        if s.shape != (channels,):
            raise ConfigError(f"{name}.out_scale has shape {s.shape}, expected ({channels},)")
        if layer.activation not in ("relu", None):
            raise ConfigError(f"{name} has activation {layer.activation} and an out_scale: "
                              f"{layer.activation}(z) * s != {layer.activation}(s * z), the keep "
                              "probability cannot fold (use relu)")
        if layer.activation == "relu" and (s < 0).any():
            raise ConfigError(f"{name}.out_scale has negative entries {s[s < 0][:4]}: a scale "
                              "moves through relu only if it is >= 0 (keep probabilities are)")
        scale = scale * s
        shift = shift * s
    if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
        raise ConfigError(f"{name}: folding gives non-finite values (check the batch norm "
                          "running_var and weights)")
    return scale, shift


def fold_scale(layer: BayesNestedLayer) -> np.ndarray:
    """The recorded per-output-channel fold scale ``a_c`` as float32 (see the module docstring)."""
    return fold_affine(layer)[0].astype(np.float32)


def fold_layer(layer: BayesNestedLayer, weight: np.ndarray | torch.Tensor | None = None,
               dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Folded ``(weight, bias)`` in torch layout (conv OIHW, depthwise [C, 1, k, k], linear
    [out, in]), so that ``act(op(x, weight) + bias) == layer(x)`` in eval mode.

    ``weight`` replaces ``layer.weight_mu`` (the posterior mean, i.e. the point network), e.g.
    with a posterior sample. With ``dtype=float32`` the weight is ``float32(W) * float32(a)``
    computed in float32, so it equals ``codebook value x fold_scale(layer)`` bit for bit.
    """
    a, t = fold_affine(layer)
    w = layer.weight_mu if weight is None else weight
    w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
    if w.shape != tuple(layer.weight_mu.shape):
        raise ConfigError(f"weight has shape {w.shape}, expected {tuple(layer.weight_mu.shape)}")
    dtype = np.dtype(dtype)
    view = (-1,) + (1,) * (w.ndim - 1)
    folded = w.astype(dtype) * a.astype(dtype).reshape(view)
    return folded, t.astype(dtype)
