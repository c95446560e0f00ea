"""What every function of :mod:`edge_sdk.answers.metrics` and :mod:`edge_sdk.answers.predictive` checks its
arguments with: each raises :class:`edge_sdk.errors.InputError`
naming the argument and what was expected, rather than letting a silently wrong number through.
Internal: the public functions are in those two modules. numpy only (it runs on the device).
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge_sdk.errors import InputError

# Probabilities computed in float32 (interpreters, exported graphs) do not sum to exactly 1.
_SUM_TOLERANCE = 1e-3


def _as_float_array(x: ArrayLike, name: str) -> NDArray[np.float64]:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"{name} must be a numeric array, got {type(x).__name__} ({exc})"
        ) from None


def _check_distributions(p: NDArray[np.float64], name: str, shape_doc: str) -> None:
    """Check that every vector along the last axis of ``p`` is a probability distribution."""
    if p.size == 0:
        raise InputError(f"{name} must not be empty; expected shape {shape_doc}, got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise InputError(f"{name} must contain only finite values; found NaN or inf")
    if np.any(p < 0):
        raise InputError(f"{name} must be probabilities >= 0; found minimum {p.min():.6g}")
    sums = p.sum(axis=-1)
    bad = np.abs(sums - 1.0) > _SUM_TOLERANCE
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        where = str(first[0]) if len(first) == 1 else str(first)
        raise InputError(
            f"{name} rows must sum to 1 (within {_SUM_TOLERANCE:g}) over the class axis; "
            f"row {where} sums to {sums[first]:.6g}. Pass probabilities, not logits (see softmax)"
        )


def _as_probs(probs: ArrayLike) -> NDArray[np.float64]:
    p = _as_float_array(probs, "probs")
    if p.ndim != 2:
        raise InputError(f"probs must be a 2-D array of shape [N, C], got shape {p.shape}")
    _check_distributions(p, "probs", "[N, C]")
    return p


def _as_labels(labels: ArrayLike, n: int, n_classes: int) -> NDArray[np.intp]:
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise InputError(
            f"labels must be a 1-D array of length N={n} (one per row of probs), "
            f"got shape {y.shape}"
        )
    # Integral floats (e.g. labels that went through a float tensor) are unambiguous; bools are not.
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        y = y.astype(np.intp)
    if y.dtype.kind not in "iu":
        raise InputError(f"labels must be integer class indices, got dtype {y.dtype}")
    if y.min() < 0 or y.max() >= n_classes:
        raise InputError(
            f"labels must be class indices in [0, {n_classes}) "
            f"for probs with C={n_classes} columns, "
            f"got values in [{y.min()}, {y.max()}]"
        )
    return y.astype(np.intp)


def _probs_and_labels(
    probs: ArrayLike, labels: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    p = _as_probs(probs)
    return p, _as_labels(labels, p.shape[0], p.shape[1])


def _as_scores(scores: ArrayLike, name: str) -> NDArray[np.float64]:
    s = _as_float_array(scores, name)
    if s.ndim != 1 or s.size == 0:
        raise InputError(f"{name} must be a non-empty 1-D array of shape [N], got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise InputError(f"{name} must contain only finite values; found NaN or inf")
    return s


def _as_samples(x: ArrayLike, name: str) -> NDArray[np.float64]:
    """``[S, N, C]`` float64, or ``[N, C]`` as one sample."""
    a = _as_float_array(x, name)
    if a.ndim == 2:
        a = a[np.newaxis]
    elif a.ndim != 3:
        raise InputError(
            f"{name} must have shape [S, N, C] (or [N, C] for a single sample), "
            f"got shape {a.shape}"
        )
    return a


def _as_sample_probs(probs_s: ArrayLike) -> NDArray[np.float64]:
    p = _as_samples(probs_s, "probs_s")
    _check_distributions(p, "probs_s", "[S, N, C]")
    return p
