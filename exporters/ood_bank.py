"""Small OOD banks: class prototypes of L2-normalised features and their per-row int8 codes.

The bank screen (docs/uncertainty.md, "The bank screen") scores an input by minus its largest
cosine similarity to a few prototypes per class instead of the 10th nearest of 1,000 random
training rows. Both pieces are numpy only and vectorised (Python loops run over classes and
iterations, never over rows):

- :func:`class_prototypes`: per class, spherical k-means (Dhillon & Modha 2001, "Concept
  decompositions for large sparse text data using clustering": assign by the largest cosine,
  centroid = the renormalised mean of its members) seeded by k-means++ (Arthur & Vassilvitskii
  2007) on the cosine distance ``1 - cos``;
- :func:`row_codes`: each row on its own symmetric grid of ``2**bits - 1`` levels. The device
  renormalises the decoded rows (:func:`edge_sdk.answers.uncertainty.decode_bank`), and a
  cosine does not see a row's scale, so the per-row scale is never stored.
"""
from __future__ import annotations

import numpy as np

from edge_sdk.errors import ConfigError

__all__ = ["class_prototypes", "row_codes"]

# how far a row's norm may be from 1 and still count as L2-normalised (float32 features
# normalised in float32 are within ~1e-7; 1e-3 only catches rows that were never normalised)
_UNIT_TOL = 1e-3


def _int_arg(value: object, name: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; ConfigError naming ``name`` otherwise (a bool is
    not a count)."""
    n = int(value) if isinstance(value, (int, np.integer)) \
        and not isinstance(value, (bool, np.bool_)) else None
    if n is None or n < low or (high is not None and n > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be an integer {span}, got {value!r}")
    return n


def _unit_matrix(unit: object, name: str = "unit") -> np.ndarray:
    """``unit`` as a finite float64 [N, D] matrix of unit rows; ConfigError naming it otherwise."""
    try:
        a = np.asarray(unit, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a numeric [N, D] array, got "
                          f"{type(unit).__name__}") from exc
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ConfigError(f"{name} must be a non-empty [N, D] array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ConfigError(f"{name} must be finite; found NaN or inf")
    return a


def _kmeans_pp_seeds(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeds (indices into ``x``, unit rows): the first uniformly, each next one with
    probability proportional to ``1 - cos`` to its nearest seed so far. For unit vectors
    ``1 - cos = ||x - c||^2 / 2``, so this is exactly the D^2 weighting of Arthur &
    Vassilvitskii on the sphere."""
    seeds = [int(rng.integers(len(x)))]
    dist = 1.0 - x @ x[seeds[0]]
    for _ in range(1, k):
        w = np.clip(dist, 0.0, None)
        w[seeds] = 0.0  # never the same row twice (float noise can leave it at ~1e-16)
        total = w.sum()
        if total > 0:
            nxt = int(rng.choice(len(x), p=w / total))
        else:  # every remaining row duplicates a seed: any unused row (the cluster may empty)
            nxt = int(rng.choice(np.setdiff1d(np.arange(len(x)), seeds)))
        seeds.append(nxt)
        dist = np.minimum(dist, 1.0 - x @ x[nxt])
    return np.asarray(seeds)


def _renormalise(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: np.ndarray = rows / np.maximum(norms, 1e-12)
    return out


def _spherical_kmeans(x: np.ndarray, k: int, iters: int, rng: np.random.Generator
                      ) -> np.ndarray:
    """[k, D] unit centroids of the unit rows ``x`` (len(x) > k): k-means++ seeds, then up to
    ``iters`` Lloyd iterations (assign by the largest cosine, centroid = renormalised mean).
    Stops early only when the assignment repeats: the centroids would not move again."""
    centres: np.ndarray = x[_kmeans_pp_seeds(x, k, rng)]
    assign = None
    for _ in range(iters):
        sim = x @ centres.T  # [n, k]
        new = sim.argmax(1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        sums = np.zeros_like(centres)
        np.add.at(sums, assign, x)
        counts = np.bincount(assign, minlength=k)
        centres = _renormalise(sums)
        empty = np.flatnonzero(counts == 0)
        if len(empty):
            # an empty cluster is re-seeded with the row farthest from its own (updated)
            # centroid, one distinct row per empty cluster: the usual repair, which splits
            # the loosest cluster rather than leaving a dead prototype in the bank
            fit = np.einsum("nd,nd->n", x, centres[assign])
            centres[empty] = x[np.argsort(fit, kind="stable")[:len(empty)]]
    return centres


def class_prototypes(unit: np.ndarray, labels: np.ndarray, per_class: int, iters: int = 25,
                     seed: int = 0) -> np.ndarray:
    """[C * per_class, D] float32 unit prototypes of the unit feature rows ``unit`` [N, D],
    ``per_class`` rows per class, classes in ascending label order (those present in ``labels``).

    ``per_class == 1``: the class mean of ``unit``, renormalised (the spherical mean, which one
    Lloyd step of spherical k-means gives anyway). Otherwise spherical k-means per class
    (module docstring): k-means++ seeding on ``1 - cos`` and ``iters`` Lloyd iterations; an
    empty cluster is re-seeded with the class row farthest from its own centroid. One
    generator seeded with ``seed`` serves the classes in order, so the result is deterministic.

    A class with at most ``per_class`` rows contributes those rows themselves (each is its own
    best prototype): a class with fewer rows than ``per_class`` has fewer prototypes, and the
    total is then below ``C * per_class``. ConfigError naming the argument on bad input."""
    x = _unit_matrix(unit)
    norms = np.linalg.norm(x, axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > _UNIT_TOL)
    if len(bad):
        raise ConfigError(f"unit must hold L2-normalised rows; row {bad[0]} has norm "
                          f"{norms[bad[0]]:.4g} ({len(bad)} such rows)")
    y = np.asarray(labels)
    if y.shape != (len(x),) or y.dtype.kind not in "iu":
        raise ConfigError(f"labels must be {len(x)} integers (one per row of unit), got shape "
                          f"{y.shape} dtype {y.dtype}")
    per_class = _int_arg(per_class, "per_class", 1)
    iters = _int_arg(iters, "iters", 1)
    seed = _int_arg(seed, "seed", 0)
    rng = np.random.default_rng(seed)
    out = []
    for c in np.unique(y):
        xc = x[y == c]
        if per_class == 1:
            out.append(_renormalise(xc.mean(0, keepdims=True)))
        elif len(xc) <= per_class:
            out.append(xc)
        else:
            out.append(_spherical_kmeans(xc, per_class, iters, rng))
    protos: np.ndarray = np.ascontiguousarray(np.concatenate(out), dtype=np.float32)
    return protos


def row_codes(unit: np.ndarray, bits: int) -> np.ndarray:
    """int8 codes [M, D] of the rows of ``unit``: ``round(r / max|r| * q)`` with
    ``q = 2**(bits - 1) - 1``, so every row uses its whole grid of ``2**bits - 1`` levels
    (a unit row's largest component is often far below 1: a fixed ``127 u`` grid wastes levels).
    A zero row stays zero. Decode with :func:`edge_sdk.answers.uncertainty.decode_bank`: it
    renormalises the rows, which is why the per-row scale need not be stored."""
    a = _unit_matrix(unit)
    bits = _int_arg(bits, "bits", 2, 8)
    q = 2 ** (bits - 1) - 1
    peak = np.abs(a).max(1, keepdims=True)
    scaled = np.divide(a, peak, out=np.zeros_like(a), where=peak > 0)
    codes: np.ndarray = np.round(scaled * q).astype(np.int8)
    return codes
