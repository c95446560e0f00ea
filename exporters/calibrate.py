"""Post-hoc calibration fitted on the validation split (numpy only): a temperature per
configuration and the confidence thresholds that reach target accuracies.

The maths underneath lives in :mod:`edge_sdk.answers.metrics` (one home, shared with the runtime and
the report): the temperature-averaged probabilities (:func:`~edge_sdk.answers.metrics.predictive_probs`,
re-exported here) and the risk–coverage curve the thresholds and cascade plans are cut from."""
from __future__ import annotations

import math
import warnings
from decimal import ROUND_FLOOR, Decimal
from typing import Sequence

import numpy as np

from edge_sdk.answers import metrics as M
from edge_sdk.answers.metrics import predictive_probs

__all__ = ["MIN_CALIBRATION_SAMPLES", "CalibrationWarning", "cascade_threshold",
           "confidence_thresholds", "fit_temperature", "predictive_probs", "short_threshold",
           "warn_if_few_samples"]

# Below this many validation samples a fitted temperature and the confidence thresholds are
# mostly noise (17 samples once gave T = 0.05, silently); the digits demo validates on 179.
MIN_CALIBRATION_SAMPLES = 100


class CalibrationWarning(UserWarning):
    """Too few validation samples to fit temperatures and confidence thresholds reliably."""


def warn_if_few_samples(n: int, stacklevel: int = 2) -> bool:
    """Warn (:class:`CalibrationWarning`) when ``n`` validation samples are too few to fit
    temperatures and thresholds; True when it warned."""
    if n >= MIN_CALIBRATION_SAMPLES:
        return False
    warnings.warn(f"only {n} validation samples to fit temperatures and confidence thresholds "
                  f"(fewer than {MIN_CALIBRATION_SAMPLES}): they will be noisy; use more "
                  "validation data (a larger data.val_fraction or data set, or a larger "
                  "--max-eval)", CalibrationWarning, stacklevel=stacklevel + 1)
    return True


def fit_temperature(logits: np.ndarray, labels: np.ndarray, lo: float = 0.05, hi: float = 20.0
                    ) -> float:
    """The T minimising validation NLL of the (sample-averaged) softmax at T (Guo et al.'s
    temperature scaling; for S samples the same T divides every sample's logits).

    A log-spaced grid finds the basin, golden-section search on log T refines it; T = 1 is
    kept unless it is beaten, so an already calibrated model is left alone. Fewer than
    :data:`MIN_CALIBRATION_SAMPLES` samples raise a :class:`CalibrationWarning`.
    """
    labels = np.asarray(labels)
    warn_if_few_samples(labels.size, stacklevel=2)  # once per caller line (Python's default)

    def nll(log_t: float) -> float:
        return M.nll(predictive_probs(logits, float(np.exp(log_t))), labels)

    grid = np.linspace(np.log(lo), np.log(hi), 61)
    values = [nll(g) for g in grid]
    i = int(np.argmin(values))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    phi = (np.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = nll(c), nll(d)
    for _ in range(40):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = nll(d)
    best = (c + d) / 2
    return float(np.exp(best)) if nll(best) < nll(0.0) else 1.0


def short_threshold(rc: M.RiskCoverage, k: int) -> float:
    """The threshold of cut ``k`` of ``rc`` in the fewest decimal digits: the shortest decimal
    ``d`` with ``next lower confidence < d <= rc.threshold[k]``. Every such ``d`` accepts
    exactly the validation samples cut ``k`` accepts (the cut was fitted on them, and no
    validation confidence lies between), so the manifest writes ``0.8488`` rather than
    ``0.8487744616831707`` and no validation decision changes (the manifest's bytes
    count against the bundle)."""
    hi = float(rc.threshold[k])
    lo = float(rc.threshold[k + 1]) if k + 1 < len(rc.threshold) else 0.0
    if not hi > 0 or not math.isfinite(hi):
        return hi
    exact = Decimal(hi)
    for digits in range(1, 18):
        # the nearest decimal (0.9 for the float 0.9, which is a little below 9/10), else the
        # one below (floor, then the nearest float: never above hi)
        quantum = Decimal(1).scaleb(exact.adjusted() - digits + 1)
        for d in (float(f"{hi:.{digits}g}"),
                  float(exact.quantize(quantum, rounding=ROUND_FLOOR))):
            if lo < d <= hi:
                return d
    return hi


def confidence_thresholds(probs: np.ndarray, labels: np.ndarray,
                          targets: Sequence[float] = (0.9, 0.95, 0.99)) -> dict[str, float | None]:
    """For each target accuracy, the lowest confidence c such that the predictions with
    confidence >= c are at least that accurate on validation (the largest such coverage);
    None when no non-empty set of confident predictions reaches it."""
    probs, labels = np.asarray(probs), np.asarray(labels)
    rc = M.risk_coverage(probs.max(1), probs.argmax(1) == labels)
    out = {}
    for t in targets:
        ok = np.nonzero(rc.accuracy >= t)[0]
        out[f"{t:g}"] = short_threshold(rc, int(ok[-1])) if len(ok) else None
    return out


def cascade_threshold(probs: np.ndarray, wider_probs: np.ndarray, labels: np.ndarray,
                      max_loss: float, targets: Sequence[float] = (0.9, 0.95, 0.99)) -> dict:
    """Plan for a two-stage cascade "answer with this configuration when confident, else run
    the wider one", fitted on validation: the lowest confidence threshold (largest coverage) at
    which answering the confident samples here instead of with the wider configuration costs at
    most ``max_loss`` accuracy over the whole set. A target-accuracy threshold of the first
    stage alone cannot promise this: the narrow network's confident samples are the easy ones,
    on which the wide network is better still (measured on Fashion-MNIST: climbing from width
    0.25 at its 0.95-accuracy threshold lost 1.55 pt against always running width 1.0).

    ``targets``: one plan per target accuracy of the cascade's answers (``load(policy=
    "cascade", target_accuracy=t)``): the lowest threshold at which the cascade's validation
    accuracy is at least ``t``, never giving up more than ``max_loss`` when the wider
    configuration itself does not reach ``t``: the accuracy it may give up is
    ``max(acc_wider - t, max_loss)``. A lax target lets the first stage answer more; a
    target whose plan is the ``max_loss`` one is left out of ``targets`` (bytes)."""
    probs, wider_probs, labels = (np.asarray(a) for a in (probs, wider_probs, labels))
    conf = probs.max(1)  # both curves cut at this configuration's confidences
    here = M.risk_coverage(conf, probs.argmax(1) == labels)
    there = M.risk_coverage(conf, wider_probs.argmax(1) == labels)
    # accuracy given up over the whole set by answering the accepted samples here
    loss = (there.correct_count - here.correct_count) / len(labels)
    acc_wider = float((wider_probs.argmax(1) == labels).mean())

    def cut(allowed: float) -> tuple[float | None, float]:
        ok = np.nonzero(loss <= allowed + 1e-12)[0]
        if not len(ok):
            return None, 0.0
        k = int(ok[-1])
        # coverage only weighs the plan's expected latency: 4 significant digits
        return short_threshold(here, k), float(f"{here.coverage[k]:.4g}")

    threshold, coverage = cut(max_loss)
    per_target = {}
    for t in targets:
        th, cov = cut(max(acc_wider - t, max_loss))
        if th != threshold:  # a target not listed plans at the plan's own threshold
            per_target[f"{t:g}"] = {"threshold": th, "coverage": cov}
    plan = {"threshold": threshold, "coverage": coverage, "max_loss": float(max_loss)}
    return {**plan, "targets": per_target} if per_target else plan
