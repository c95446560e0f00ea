"""Quality and uncertainty metrics, defined once for the trainer, the exporters and the runtime.

Also the one home of the maths the exporters and benchmarks share: posterior averaging at a
temperature (:func:`predictive_probs`, with softmax and the entropies defined in
:mod:`edge_sdk.answers.predictive` and re-exported here), selective prediction (:func:`risk_coverage`, which the
exported confidence thresholds and cascade plans are cut from) and the weight entropy the
manifest records (:func:`codebook_stats`).

numpy only, because this module runs on the device. Every public function validates its
inputs and raises :class:`edge_sdk.errors.InputError` naming the argument and what was
expected, rather than returning a silently wrong number. Logarithms are natural.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge_sdk.errors import InputError
from edge_sdk.answers.metric_inputs import _as_scores, _probs_and_labels
# re-exported: metrics is where the trainer, exporters and benchmarks look for them
from edge_sdk.answers.predictive import (expected_entropy, log_softmax, mutual_information,
                                 predictive_entropy, predictive_probs, sample_probs, softmax)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "ReliabilityBins",
    "RiskCoverage",
    "accuracy",
    "auroc",
    "brier",
    "codebook_stats",
    "ece",
    "expected_entropy",
    "log_softmax",
    "mutual_information",
    "nll",
    "ood_aupr",
    "ood_auroc",
    "ood_fpr_at_tpr",
    "predictive_entropy",
    "predictive_probs",
    "reliability_bins",
    "risk_coverage",
    "sample_probs",
    "selective_accuracy",
    "softmax",
    "summarize",
    "weight_entropy_bits",
]

# --------------------------------------------------------------------------- classification quality


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of samples whose most probable class (``probs`` [N, C]) equals ``labels`` [N]."""
    p, y = _probs_and_labels(probs, labels)
    return float(np.mean(p.argmax(axis=1) == y))


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> float:
    """Mean negative log probability of the true class.

    Probabilities are clipped at ``eps`` so a confident mistake costs ``-log(eps)``, not inf.
    """
    if not (np.isfinite(eps) and 0.0 < eps < 1.0):
        raise InputError(f"eps must be a number in (0, 1), got {eps!r}")
    p, y = _probs_and_labels(probs, labels)
    p_true = np.clip(p[np.arange(y.size), y], eps, 1.0)
    return float(-np.mean(np.log(p_true)))


def brier(probs: ArrayLike, labels: ArrayLike) -> float:
    """Brier score: mean over samples of ``sum_c (p_c - onehot_c)^2`` (range [0, 2])."""
    p, y = _probs_and_labels(probs, labels)
    onehot = np.zeros_like(p)
    onehot[np.arange(y.size), y] = 1.0
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


@dataclass(frozen=True, eq=False)
class ReliabilityBins:
    """Calibration statistics over equal-width confidence bins (confidence = max probability).

    Bin ``k`` covers ``(edges[k], edges[k + 1]]``; the first bin also includes 0. Empty bins
    have ``counts == 0`` and NaN ``accuracy`` and ``confidence``.
    """

    edges: NDArray[np.float64]  # [n_bins + 1]
    counts: NDArray[np.intp]  # [n_bins]
    accuracy: NDArray[np.float64]  # [n_bins], fraction correct per bin
    confidence: NDArray[np.float64]  # [n_bins], mean confidence per bin

    @property
    def ece(self) -> float:
        """Expected calibration error: ``sum_k (n_k / N) |accuracy_k - confidence_k|``."""
        filled = self.counts > 0
        weights = self.counts[filled] / self.counts.sum()
        return float(np.sum(weights * np.abs(self.accuracy[filled] - self.confidence[filled])))

    def plot(self, ax: Axes | None = None) -> Axes:
        """Draw the reliability diagram on ``ax`` (a new figure if None) and return the axes.

        matplotlib is a workstation dependency (the ``train`` extras), so it is imported only
        when a new figure is needed.
        """
        if ax is None:
            try:
                import matplotlib.pyplot as plt
            except ImportError as exc:
                raise ImportError(
                    "ReliabilityBins.plot needs matplotlib: pip install matplotlib"
                ) from exc
            _, ax = plt.subplots(figsize=(4, 4))
        filled = self.counts > 0
        left = self.edges[:-1][filled]
        width = np.diff(self.edges)[filled]
        acc = self.accuracy[filled]
        ax.bar(left, acc, width=width, align="edge", edgecolor="black", label="accuracy")
        ax.bar(
            left,
            self.confidence[filled] - acc,
            bottom=acc,
            width=width,
            align="edge",
            color="red",
            alpha=0.3,
            edgecolor="red",
            label="gap to confidence",
        )
        ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="perfect calibration")
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_title(f"ECE = {self.ece:.4f}")
        ax.legend(loc="upper left")
        return ax


def _check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InputError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    return int(n_bins)


def reliability_bins(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> ReliabilityBins:
    """Bin samples by confidence into ``n_bins`` equal-width bins over [0, 1].

    See :class:`ReliabilityBins` for the bin convention.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _probs_and_labels(probs, labels)
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) == y
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # side="left" on the inner edges sends a confidence equal to an edge to the bin below it,
    # i.e. (lo, hi] bins; 0 lands in bin 0 and 1 (or 1 + rounding) in the last bin.
    idx = np.searchsorted(edges[1:-1], conf, side="left")
    counts = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore"):  # 0 / 0 -> NaN marks empty bins
        bin_acc = np.bincount(idx, weights=correct, minlength=n_bins) / counts
        bin_conf = np.bincount(idx, weights=conf, minlength=n_bins) / counts
    return ReliabilityBins(edges=edges, counts=counts, accuracy=bin_acc, confidence=bin_conf)


def ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """Expected calibration error over ``n_bins`` equal-width confidence bins."""
    return reliability_bins(probs, labels, n_bins).ece


def summarize(probs: ArrayLike, labels: ArrayLike) -> dict[str, float]:
    """The headline quality numbers: accuracy, NLL, Brier and ECE (15 bins)."""
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels),
    }


# --------------------------------------------------------------------------- ranking


def auroc(scores: ArrayLike, is_positive: ArrayLike) -> float:
    """Exact area under the ROC curve.

    The probability that a random positive scores higher than a random negative, ties
    counting 1/2: the Mann–Whitney U statistic computed from average ranks.
    """
    s = _as_scores(scores, "scores")
    pos = np.asarray(is_positive)
    if pos.ndim != 1 or pos.shape[0] != s.size:
        raise InputError(
            f"is_positive must be a 1-D array of length N={s.size} (one per score), "
            f"got shape {pos.shape}"
        )
    if pos.dtype.kind != "b":
        if pos.dtype.kind not in "iuf" or not np.all((pos == 0) | (pos == 1)):
            raise InputError(f"is_positive must be booleans (or 0/1), got dtype {pos.dtype}")
        pos = pos.astype(bool)
    n_pos = int(pos.sum())
    n_neg = pos.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise InputError(
            f"is_positive must contain both classes for AUROC to be defined, "
            f"got {n_pos} positive and {n_neg} negative"
        )
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # Tied scores share the mean of the 1-based ranks they occupy.
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0
    ranks = mean_rank[inverse.reshape(-1)]
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def ood_auroc(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    """AUROC of separating out-of-distribution from in-distribution inputs.

    OOD is the positive class, so the score must grow with "more OOD" (e.g. predictive entropy).
    """
    s_in = _as_scores(scores_in, "scores_in")
    s_out = _as_scores(scores_out, "scores_out")
    is_out = np.concatenate([np.zeros(s_in.size, dtype=bool), np.ones(s_out.size, dtype=bool)])
    return auroc(np.concatenate([s_in, s_out]), is_out)


def ood_fpr_at_tpr(scores_in: ArrayLike, scores_out: ArrayLike, tpr: float = 0.95) -> float:
    """Share of out-of-distribution inputs accepted when ``tpr`` of in-distribution ones are.

    Accepted = score <= t, with t the smallest in-distribution score such that at least ``tpr``
    of the in-distribution scores are <= t ("FPR at 95 % TPR", in-distribution the accepted class).
    """
    s_in = _as_scores(scores_in, "scores_in")
    s_out = _as_scores(scores_out, "scores_out")
    if not 0.0 < tpr <= 1.0:
        raise InputError(f"tpr must be in (0, 1], got {tpr}")
    t = np.sort(s_in)[max(int(math.ceil(tpr * s_in.size - 1e-9)) - 1, 0)]
    return float(np.mean(s_out <= t))


def ood_aupr(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    """Area under the precision-recall curve with OOD as the positive class (average precision:
    sum over distinct thresholds of recall step x precision, as scikit-learn computes it)."""
    s_in = _as_scores(scores_in, "scores_in")
    s_out = _as_scores(scores_out, "scores_out")
    s = np.concatenate([s_in, s_out])
    pos = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    order = np.argsort(-s, kind="stable")
    s, pos = s[order], pos[order]
    last = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]  # last index of each distinct score
    tp = np.cumsum(pos)[last]
    fp = (last + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / s_out.size
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


# --------------------------------------------------------------------------- selective prediction


@dataclass(frozen=True, eq=False)
class RiskCoverage:
    """Selective prediction when abstaining below a confidence threshold.

    Point ``k`` accepts every sample with confidence >= ``threshold[k]``; cuts fall only between
    distinct confidences (tied samples are all in or all out), so ``coverage`` is strictly
    increasing and ends at 1, where ``accuracy`` is the overall accuracy.
    """

    coverage: NDArray[np.float64]  # [K] fraction of samples accepted
    accuracy: NDArray[np.float64]  # [K] accuracy of the accepted samples (1 - selective risk)
    threshold: NDArray[np.float64]  # [K] the lowest accepted confidence, decreasing
    correct_count: NDArray[np.int64]  # [K] correct samples among the accepted (exact integers)


def _selective_inputs(confidence: ArrayLike, correct: ArrayLike
                      ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct)
    if conf.ndim != 1 or conf.size == 0:
        raise InputError(f"confidence must be a non-empty 1-D array, got shape {conf.shape}")
    if ok.shape != conf.shape:
        raise InputError(f"correct must have the shape of confidence {conf.shape}, got {ok.shape}")
    if not np.all(np.isfinite(conf)):
        raise InputError("confidence must contain only finite values; found NaN or inf")
    if ok.dtype.kind != "b":
        if ok.dtype.kind not in "iuf" or not np.all((ok == 0) | (ok == 1)):
            raise InputError(f"correct must be booleans (or 0/1), got dtype {ok.dtype}")
        ok = ok.astype(bool)
    return conf, ok


def risk_coverage(confidence: ArrayLike, correct: ArrayLike) -> RiskCoverage:
    """The risk–coverage curve of per-sample ``confidence`` [N] and ``correct`` [N] (bool).

    The exporter's confidence thresholds (the largest coverage reaching a target accuracy) and
    cascade plans are read off this curve.
    """
    conf, ok = _selective_inputs(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    conf, ok = conf[order], ok[order]
    accepted = np.arange(1, conf.size + 1)
    hits = np.cumsum(ok, dtype=np.int64)
    cum_acc = hits / accepted
    # only cut between distinct confidences: samples tied at c are all in or all out
    last_of_value = np.r_[conf[1:] != conf[:-1], True]
    return RiskCoverage(coverage=accepted[last_of_value] / conf.size,
                        accuracy=cum_acc[last_of_value], threshold=conf[last_of_value],
                        correct_count=hits[last_of_value])


def selective_accuracy(confidence: ArrayLike, correct: ArrayLike, threshold: float
                       ) -> tuple[float, float]:
    """(coverage, accuracy of the accepted) when accepting confidence >= ``threshold``;
    accuracy is NaN when nothing is accepted."""
    conf, ok = _selective_inputs(confidence, correct)
    accepted = conf >= threshold
    coverage = float(accepted.mean())
    return coverage, float(ok[accepted].mean()) if accepted.any() else math.nan


# --------------------------------------------------------------------------- compression


def codebook_stats(values: ArrayLike) -> tuple[int, float]:
    """(distinct values, entropy in bits of the empirical distribution over them) of weight
    ``values`` (any shape): exact values, no bins. The manifest's ``unique_values`` and
    ``weight_entropy_bits``, and PWFN's codebook report."""
    _, counts = np.unique(np.asarray(values).ravel(), return_counts=True)
    p = counts / counts.sum()
    return int(counts.size), float(-(p * np.log2(p)).sum())


def weight_entropy_bits(values: ArrayLike) -> float:
    """Entropy in bits of the empirical distribution over the exact unique values (no bins)."""
    return codebook_stats(values)[1]
