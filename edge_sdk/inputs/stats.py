"""Inputs unlike the training data: the training split's per-channel statistics, as
the manifest carries them (schema version 6, ``input_stats``), and the check each call makes.

A value outside the declared raw range is refused (:class:`~edge_sdk.errors.InputError`,
edge_sdk.inputs.checks). This catches what lies *inside* the range but looks nothing like a training
sample, e.g. digits scaled to [0, 1] for a bundle trained on [0, 16] (each value is in range;
the image as a whole is 16 times too dark). Per channel, a sample's **mean** and **maximum**
are compared with the band the training split's samples span (their 0.1st to 99.9th
percentile), widened on both sides by ``margin`` (raw units; the exporter states it as a
fraction of the value range, 10 %). A sample outside any band is ``input_suspect``.

Two statistics per channel, because they are what a mis-scaled or mis-ordered input moves
and they cost one reduction each (every microsecond of the SDK counts); the manifest also
records each channel's mean and high quantiles (99th, 99.9th percentile) of the raw values
for the reader. The OOD score of ``uncertainty.bin`` looks at the features instead;
the two complement each other and both make a call abstain (edge_sdk.answers.prediction.abstains).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from edge_sdk.bundle.stats import InputStats

__all__ = ["InputStats", "SuspectCheck"]


class SuspectCheck:
    """The per-call check of :class:`InputStats` on raw (validated) samples: vectorised, one
    mean and one maximum per channel."""

    def __init__(self, stats: InputStats):
        m = stats.margin
        c = self.channels = stats.channels
        # rows: mean lo, max lo (the sample's statistic must be >= these), then mean hi, max hi
        self._lo = np.array([[b[0] - m for b in stats.sample_mean],
                             [b[0] - m for b in stats.sample_max]], np.float64).reshape(2, c)
        self._hi = np.array([[b[1] + m for b in stats.sample_mean],
                             [b[1] + m for b in stats.sample_max]], np.float64).reshape(2, c)
        self._lo_list, self._hi_list = self._lo.tolist(), self._hi.tolist()
        if c == 1:  # the common grey case in plain floats (cheaper than numpy on 2 values)
            self._flat = (float(self._lo[0, 0]), float(self._hi[0, 0]),
                          float(self._lo[1, 0]), float(self._hi[1, 0]))

    def one(self, x: npt.NDArray[Any]) -> bool:
        """Whether one raw sample (``[H, W, C]``, ``[1, H, W, C]`` or a grey ``[H, W]``) is
        suspect."""
        if self.channels == 1:
            mean = float(np.add.reduce(x, axis=None)) / x.size
            top = float(np.maximum.reduce(x, axis=None))
            a, b, c, d = self._flat
            return not (a <= mean <= b and c <= top <= d)
        # each channel made contiguous first: a reduction across the interleaved
        # channels of a 32x32x3 image costs 15-28 us, the transposed copy and two contiguous
        # reductions ~5 us
        t = np.ascontiguousarray(x.reshape(-1, self.channels).T)  # [C, H*W]
        n = t.shape[1]
        means = (np.add.reduce(t, 1, dtype=np.float64) / n).tolist()
        tops = np.maximum.reduce(t, 1).tolist()
        for c, (m, top) in enumerate(zip(means, tops)):
            if not (self._lo_list[0][c] <= m <= self._hi_list[0][c]
                    and self._lo_list[1][c] <= top <= self._hi_list[1][c]):
                return True
        return False

    def batch(self, xs: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        """``[N]`` bools of raw samples ``[N, H, W, C]`` (or grey ``[N, H, W]``)."""
        per = int(np.prod(xs.shape[1:])) // self.channels  # explicit: N may be 0
        # [N, C, H*W] contiguous, as in one()
        t = np.ascontiguousarray(xs.reshape(len(xs), per, self.channels).transpose(0, 2, 1))
        stat = np.stack([np.add.reduce(t, 2, dtype=np.float64) / per,
                         np.maximum.reduce(t, 2)], 1)  # [N, 2, C]
        # (any over two axes of a 3-D array is an array; asarray returns that very array)
        return np.asarray(((stat < self._lo) | (stat > self._hi)).any((1, 2)))
