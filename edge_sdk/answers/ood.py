"""Out-of-distribution scores from a slice's logits and penultimate features.

numpy only: the device computes these with statistics the workstation fitted (on the training
split, never on OOD data) and the benchmarks (``benchmarks/ood_scores.py``) use the very same
functions, so what is measured is what ships. Every score grows with "less like the training
data" (OOD = positive class), like predictive entropy.

- :func:`energy_score`: ``-T logsumexp(z / T)`` (Liu et al. 2020).
- :func:`knn_score`: minus the cosine similarity to the k-th nearest neighbour in a bank of
  L2-normalised training features (Sun et al. 2022); ``1 - cos`` = half the squared L2 distance
  between unit vectors, so the order is the paper's.
- :func:`mahalanobis_score` / :func:`relative_mahalanobis_score`: the smallest squared
  Mahalanobis distance to a class mean under a shared covariance (Lee et al. 2018), and that
  minus the distance to one Gaussian fitted to all training features (Ren et al. 2021),
  covariances shrunk with Ledoit–Wolf (:func:`ledoit_wolf`, scikit-learn's estimator).
- :func:`fit_zscore` / :func:`fused_score`: a sum of scores, each z-normalised with the mean and
  standard deviation of in-distribution *validation* scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from edge_sdk.errors import InputError

__all__ = [
    "GaussianStats",
    "energy_score",
    "fit_gaussian",
    "fit_zscore",
    "fused_score",
    "knn_score",
    "l2_normalise",
    "ledoit_wolf",
    "mahalanobis_score",
    "relative_mahalanobis_score",
]


_S = TypeVar("_S", bound=np.generic)


def _matrix(x: ArrayLike, name: str, cols: int | None = None) -> NDArray[np.float64]:
    """``x`` as a checked float64 matrix (see :func:`_checked`)."""
    a: NDArray[np.float64] = _as_array(x, name, np.float64)
    return _checked(a, name, cols)


def _as_array(x: ArrayLike, name: str, dtype: DTypeLike) -> NDArray[Any]:
    try:
        return np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a numeric array, got {type(x).__name__}") from exc


def _checked(a: NDArray[_S], name: str, cols: int | None = None) -> NDArray[_S]:
    """``a`` when it is a non-empty, finite [N, D] matrix (``cols`` columns); InputError
    naming ``name`` otherwise."""
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise InputError(f"{name} must be a non-empty 2-D array [N, D], got shape {a.shape}")
    if cols is not None and a.shape[1] != cols:
        raise InputError(f"{name} must have {cols} columns (the fitted feature size), got {a.shape[1]}")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{name} must contain only finite values; found NaN or inf")
    return a


def energy_score(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    """``-T logsumexp(z / T)`` per row of ``logits`` [N, C] (higher = more OOD)."""
    z = _matrix(logits, "logits")
    if not (np.isfinite(temperature) and temperature > 0):
        raise InputError(f"temperature must be a positive finite number, got {temperature}")
    s = z / temperature
    m = s.max(-1, keepdims=True)
    energy: NDArray[np.float64] = -temperature * (m[:, 0] + np.log(np.exp(s - m).sum(-1)))
    return energy


def l2_normalise(features: ArrayLike, eps: float = 1e-12) -> NDArray[np.float64]:
    f = _matrix(features, "features")
    unit: NDArray[np.float64] = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), eps)
    return unit


def knn_score(features: ArrayLike, bank: ArrayLike, k: int = 10, chunk: int = 2048
              ) -> NDArray[np.float64]:
    """Minus the cosine similarity of each (normalised) feature row to its k-th nearest row of
    ``bank`` (already L2-normalised, [M, D]); a float32 or float16 bank is used as stored (no
    per-call float64 copy), the features cast to its dtype."""
    stored = getattr(bank, "dtype", None)
    dtype: DTypeLike = np.float64
    if stored is not None and stored in (np.float32, np.float16):
        dtype = stored
    b = _checked(_as_array(bank, "bank", dtype), "bank")
    f = l2_normalise(_matrix(features, "features", b.shape[1])).astype(b.dtype, copy=False)
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= b.shape[0]):
        raise InputError(f"k must be an integer in [1, {b.shape[0]}] (the bank size), got {k!r}")
    out = np.empty(f.shape[0])
    for i in range(0, f.shape[0], chunk):
        sim = f[i:i + chunk] @ b.T
        # the k-th largest similarity: partition puts it at index M - k
        out[i:i + chunk] = -np.partition(sim, b.shape[0] - k, axis=1)[:, b.shape[0] - k]
    return out


def ledoit_wolf(x: ArrayLike, assume_centered: bool = False) -> tuple[NDArray[np.float64], float]:
    """Ledoit–Wolf shrunk covariance of rows of ``x`` and its shrinkage in [0, 1] (the estimator
    and formula of ``sklearn.covariance.ledoit_wolf``, block size aside)."""
    a = _matrix(x, "x")
    n, d = a.shape
    if not assume_centered:
        a = a - a.mean(0)
    emp = a.T @ a / n
    mu = np.trace(emp) / d
    x2 = a ** 2
    beta_ = float(np.sum(x2.T @ x2))
    delta_ = float(np.sum(emp ** 2))
    delta = (delta_ - 2.0 * mu * np.trace(emp) + d * mu ** 2) / d
    beta = min((beta_ / n - delta_) / (d * n), delta)
    shrinkage = 0.0 if beta == 0 else beta / delta
    cov = (1.0 - shrinkage) * emp
    cov.flat[:: d + 1] += shrinkage * mu
    return cov, float(shrinkage)


@dataclass(frozen=True)
class GaussianStats:
    """Class means [C, D] with one shared precision [D, D], and one Gaussian over all features
    (mean [D], precision [D, D]) for the relative score."""

    means: NDArray[np.float64]
    precision: NDArray[np.float64]
    global_mean: NDArray[np.float64]
    global_precision: NDArray[np.float64]


def fit_gaussian(features: ArrayLike, labels: ArrayLike, num_classes: int) -> GaussianStats:
    """Class means and the Ledoit–Wolf shared covariance of class-centred training features."""
    f = _matrix(features, "features")
    y = np.asarray(labels)
    if y.shape != (f.shape[0],) or y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= num_classes:
        raise InputError(f"labels must be {f.shape[0]} integers in [0, {num_classes}), got shape "
                         f"{y.shape} dtype {y.dtype}")
    counts = np.bincount(y, minlength=num_classes)
    if np.any(counts == 0):
        raise InputError(f"every class needs training features; classes {np.flatnonzero(counts == 0).tolist()} have none")
    means = np.zeros((num_classes, f.shape[1]))
    np.add.at(means, y, f)
    means /= counts[:, None]
    cov, _ = ledoit_wolf(f - means[y], assume_centered=True)
    gcov, _ = ledoit_wolf(f)
    # (pinv of float64 is float64: astype(copy=False) only says so to the type checker)
    return GaussianStats(means, np.linalg.pinv(cov, hermitian=True).astype(np.float64, copy=False),
                         f.mean(0),
                         np.linalg.pinv(gcov, hermitian=True).astype(np.float64, copy=False))


def _sq_dist(f: NDArray[np.float64], means: NDArray[np.float64], precision: NDArray[np.float64]
             ) -> NDArray[np.float64]:
    """[N, C] squared Mahalanobis distances, expanded so no [N, C, D] tensor is built."""
    fp = f @ precision
    mp = means @ precision
    d2: NDArray[np.float64] = (fp * f).sum(1)[:, None] - 2.0 * fp @ means.T \
        + (mp * means).sum(1)[None, :]
    return d2


def mahalanobis_score(features: ArrayLike, stats: GaussianStats) -> NDArray[np.float64]:
    f = _matrix(features, "features", stats.means.shape[1])
    nearest: NDArray[np.float64] = _sq_dist(f, stats.means, stats.precision).min(1)
    return nearest


def relative_mahalanobis_score(features: ArrayLike, stats: GaussianStats) -> NDArray[np.float64]:
    f = _matrix(features, "features", stats.means.shape[1])
    d0 = _sq_dist(f, stats.global_mean[None, :], stats.global_precision)[:, 0]
    nearest: NDArray[np.float64] = (_sq_dist(f, stats.means, stats.precision)
                                    - d0[:, None]).min(1)
    return nearest


def fit_zscore(val_scores: ArrayLike) -> tuple[float, float]:
    """(mean, std) of an in-distribution validation score, for :func:`fused_score`."""
    s = np.asarray(val_scores, dtype=np.float64)
    if s.ndim != 1 or s.size < 2 or not np.all(np.isfinite(s)):
        raise InputError(f"val_scores must be a finite 1-D array of at least 2 scores, got shape {s.shape}")
    sd = float(s.std())
    if sd == 0:
        raise InputError("val_scores are constant: a z-normalisation needs a spread")
    return float(s.mean()), sd


def fused_score(scores: list[ArrayLike], norms: list[tuple[float, float]]) -> NDArray[np.float64]:
    """Sum of z-normalised scores (each ``(s - mean) / std`` with its validation statistics)."""
    if not scores or len(scores) != len(norms):
        raise InputError(f"fused_score needs one (mean, std) per score, got {len(scores)} scores "
                         f"and {len(norms)} norms")
    total: NDArray[np.float64] | float = 0.0  # as sum() starts, from 0
    for s, (m, sd) in zip(scores, norms):
        total = total + (np.asarray(s, np.float64) - m) / sd
    return np.asarray(total)
