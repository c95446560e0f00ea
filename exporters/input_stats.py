"""Fit the manifest's ``input_stats`` (schema version 6) from the training split's raw
NHWC samples: what :mod:`edge_sdk.inputs.stats` checks each call against (the rule is stated
there). numpy only, chunked (a CIFAR-sized split never makes a full float64 copy).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BAND", "MARGIN", "fit_input_stats"]

# The band of per-sample statistics: the 0.1st .. 99.9th percentile of the training samples'
# (so about 0.2 % of training-like samples fall outside before the margin; the goal allows 1 %
# of the test split flagged)
BAND = (0.1, 99.9)
# Each band widened on both sides by this fraction of the declared value range: the test split
# is not the training split (a test image a little darker than any training image is not a
# mistake), while an input scaled to [0, 1] for a [0, 16] or [0, 255] bundle is off by most of
# the range
MARGIN = 0.10
_CHUNK = 2048


def fit_input_stats(raw: np.ndarray, value_range: tuple[float, float],
                    margin: float = MARGIN) -> dict:
    """``input_stats`` of raw NHWC training samples ``[N, H, W, C]``, as manifest data."""
    raw = np.asarray(raw)
    if raw.ndim != 4 or len(raw) == 0:
        raise ValueError(f"expected raw NHWC training samples [N, H, W, C], got shape "
                         f"{raw.shape}")
    n, c = len(raw), raw.shape[-1]
    means = np.empty((n, c))
    maxima = np.empty((n, c))
    total = np.zeros(c)
    for i in range(0, n, _CHUNK):
        v = raw[i:i + _CHUNK].reshape(min(_CHUNK, n - i), -1, c).astype(np.float64)
        means[i:i + len(v)] = v.mean(1)
        maxima[i:i + len(v)] = v.max(1)
        total += v.sum((0, 1))
    # the raw values' high quantiles, on a fixed-size random draw of pixels (exact quantiles
    # of 20k x 1024 values per channel would sort 20 M numbers for a number a reader glances at)
    rng = np.random.default_rng(0)
    flat = raw.reshape(-1, c)
    pix = flat[rng.integers(0, len(flat), min(len(flat), 1_000_000))].astype(np.float64)
    q99, q999 = np.percentile(pix, [99.0, 99.9], axis=0)
    lo, hi = value_range

    def bands(a: np.ndarray) -> list[list[float]]:
        b = np.percentile(a, BAND, axis=0)  # [2, C]
        return [[float(b[0, j]), float(b[1, j])] for j in range(c)]

    return {"channels": int(c),
            "mean": [float(v) for v in total / (n * raw.shape[1] * raw.shape[2])],
            "q99": [float(v) for v in q99], "q999": [float(v) for v in q999],
            "sample_mean": bands(means), "sample_max": bands(maxima),
            "margin": float(margin * (hi - lo))}
