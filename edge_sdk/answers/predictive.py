"""From logits to probabilities, and the entropies of a posterior's samples (metrics.py
re-exports every public name here): the maths the exporters, the report and
the benchmarks share with the runtime (whose ``predict`` computes the same average and
entropies inlined on its hot path, edge_sdk/answers/maths.py).

The entropies split the posterior predictive's uncertainty: predictive entropy
``H[mean_s p_s]`` = expected entropy ``mean_s H[p_s]`` (aleatoric) + mutual information
(epistemic). numpy only; logarithms are natural; every function validates its inputs
(:mod:`edge_sdk.answers.metric_inputs`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge_sdk.errors import InputError
from edge_sdk.answers.metric_inputs import _as_sample_probs, _as_samples

__all__ = ["expected_entropy", "log_softmax", "mutual_information", "predictive_entropy",
           "predictive_probs", "sample_probs", "softmax"]

# --------------------------------------------------------------------------- entropies


def _entropy(p: NDArray[np.float64]) -> NDArray[np.float64]:
    # log(1) = 0 stands in for log(0), so zero probabilities contribute 0 without a warning.
    h: NDArray[np.float64] = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=-1)
    return h


def _predictive_entropy(p: NDArray[np.float64]) -> NDArray[np.float64]:
    return _entropy(p.mean(axis=0))


def _expected_entropy(p: NDArray[np.float64]) -> NDArray[np.float64]:
    h: NDArray[np.float64] = _entropy(p).mean(axis=0)
    return h


def predictive_entropy(probs_s: ArrayLike) -> NDArray[np.float64]:
    """``H[mean_s p_s]`` per input, from sample probabilities [S, N, C] (or [N, C]); returns [N]."""
    return _predictive_entropy(_as_sample_probs(probs_s))


def expected_entropy(probs_s: ArrayLike) -> NDArray[np.float64]:
    """``mean_s H[p_s]`` per input (aleatoric part), from [S, N, C] (or [N, C]); returns [N]."""
    return _expected_entropy(_as_sample_probs(probs_s))


def mutual_information(probs_s: ArrayLike) -> NDArray[np.float64]:
    """Predictive minus expected entropy, clamped at 0 (epistemic part); returns [N].

    Input as for :func:`predictive_entropy`.
    """
    p = _as_sample_probs(probs_s)
    # Non-negative in exact arithmetic (Jensen); only rounding can push it below 0.
    return np.maximum(_predictive_entropy(p) - _expected_entropy(p), 0.0)


# --------------------------------------------------------------------------- logits


def _scaled_logits(logits: ArrayLike, axis: int, temperature: float
                   ) -> NDArray[np.floating[Any]]:
    x = np.asarray(logits)
    if x.dtype.kind not in "iuf":
        raise InputError(f"logits must be a numeric array, got dtype {x.dtype}")
    # Keep float32 float32 (device outputs); promote integers and float16.
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    if x.ndim == 0:
        raise InputError("logits must have at least one dimension, got a scalar")
    if not -x.ndim <= axis < x.ndim:
        raise InputError(
            f"axis must be in [{-x.ndim}, {x.ndim}) for logits of shape {x.shape}, got {axis}"
        )
    if not np.all(np.isfinite(x)):
        raise InputError("logits must contain only finite values; found NaN or inf")
    if not (np.isfinite(temperature) and temperature > 0):
        raise InputError(f"temperature must be a finite number > 0, got {temperature!r}")
    z = x / temperature
    # Shifting by the max changes nothing mathematically and keeps exp() from overflowing.
    shifted: NDArray[np.floating[Any]] = z - z.max(axis=axis, keepdims=True)
    return shifted


def softmax(logits: ArrayLike, axis: int = -1, temperature: float = 1.0
            ) -> NDArray[np.floating[Any]]:
    """Numerically stable ``softmax(logits / temperature)`` along ``axis``."""
    e = np.exp(_scaled_logits(logits, axis, temperature))
    p: NDArray[np.floating[Any]] = e / e.sum(axis=axis, keepdims=True)
    return p


def log_softmax(
    logits: ArrayLike, axis: int = -1, temperature: float = 1.0
) -> NDArray[np.floating[Any]]:
    """Numerically stable ``log(softmax(logits / temperature))`` along ``axis``."""
    z = _scaled_logits(logits, axis, temperature)
    logp: NDArray[np.floating[Any]] = z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    return logp


def sample_probs(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    """``softmax(logits_s / temperature)`` per posterior sample, in float64: [S, N, C] from
    logits [S, N, C] (or [N, C]: one sample)."""
    x = _as_samples(logits, "logits")
    return softmax(x, axis=-1, temperature=temperature).astype(np.float64, copy=False)  # x: f64


def predictive_probs(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    """``mean_s softmax(logits_s / T)``: the Bayesian model average at temperature T, [N, C].

    What the manifest's test metrics, the exporter's thresholds and the report are computed
    on; the runtime's ``predict`` computes the same average (inlined on its hot path).
    """
    mean: NDArray[np.float64] = sample_probs(logits, temperature).mean(axis=0)
    return mean
