"""Split-conformal prediction sets, numpy only.

Calibrate once on labelled validation data (:func:`calibrate`: the conformal quantile of the
scores of the true labels), then every set is "the classes whose score is at most the quantile"
(:func:`prediction_sets`). With calibration and test data exchangeable, a set contains the true
label with probability >= 1 - alpha (marginally over calibration and test draws), and < 1 - alpha
+ 1 / (n + 1) when scores have no ties.

Scores (one per candidate label, smaller = more conforming):

- ``lac`` (Sadinle et al. 2019, "least ambiguous set-valued classifiers"): ``1 - p_y``. Smallest
  mean set size at a given coverage; sets may be empty.
- ``aps`` (Romano et al. 2020): the probability mass of every class ranked at or above ``y``.
  Deterministic unless ``rng`` is given; then the paper's randomised score (mass ranked above
  ``y`` + U * p_y, U uniform per sample): deterministic APS keeps coverage >= 1 - alpha but its
  sets are much larger on confident models (benchmarks/results/ood_scores_conformal_*.md).
- ``raps`` (Angelopoulos et al. 2021): APS + ``lam * max(0, rank(y) - k_reg)`` (rank 1-based),
  which penalises long tails of unlikely classes.

The non-empty rule (on by default: ``nonempty=True``; RAPS's reference code does the same,
``allow_zero_sets=False``): every set also holds the top class (the first maximum of the
probabilities, the answer's label). A plain LAC set is empty when even the top class is less
conforming than the quantile, which on a confident model is a *right* answer at 0.997 whenever
90 % of the validation answers were surer: reading that as "nothing is plausible" would throw
away answers that are right 99.7 % of the time. The rule only adds a class, so coverage can only
rise (it stays >= 1 - alpha; the upper bound 1 - alpha + 1 / (n + 1) no longer holds). It
changes nothing else: every score above is non-decreasing in the class's rank (LAC: 1 - p; APS /
RAPS: mass ranked at or above, plus a penalty non-decreasing in the rank; the randomised APS
too, U being one draw per sample), so a non-empty set already holds the top class and the rule
turns exactly the empty sets into ``{top}``: the mean size grows by the share of empty sets. """
from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edge_sdk.errors import InputError
from edge_sdk.validation import real_value

__all__ = ["METHODS", "add_top", "calibrate", "class_scores", "label_scores", "prediction_sets"]

METHODS = ("lac", "aps", "raps")


def _probs(probs: ArrayLike) -> NDArray[np.float64]:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2:
        raise InputError(f"probs must be [N, C] with N >= 1 and C >= 2, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or not np.allclose(p.sum(1), 1.0, atol=1e-4):
        raise InputError("probs must be finite, non-negative rows summing to 1")
    return p


def _method(method: str, lam: float, k_reg: int) -> None:
    if method not in METHODS:
        raise InputError(f"conformal method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "raps" and not (lam >= 0 and isinstance(k_reg, (int, np.integer)) and k_reg >= 0):
        raise InputError(f"raps needs lam >= 0 and an integer k_reg >= 0, got lam={lam}, k_reg={k_reg!r}")


def _uniforms(rng: object, n: int) -> NDArray[np.float64] | None:
    if rng is None:
        return None
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"rng must be a numpy Generator (np.random.default_rng(seed)) or None, got {type(rng).__name__}")
    return rng.random(n)


def class_scores(probs: ArrayLike, method: str = "lac", lam: float = 0.01, k_reg: int = 5,
                 u: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """[N, C]: the score each class would have if it were the label; ``u`` ([N] uniforms)
    randomises APS / RAPS (ignored by LAC)."""
    _method(method, lam, k_reg)
    p = _probs(probs)
    if method == "lac":
        return 1.0 - p
    # the cumulative mass of float32 probabilities (the interpreter's) can end at 1 + 1e-7
    # and miss a quantile of exactly 1 (every class): renormalised rows end at 1 (float64)
    p = p / p.sum(1, keepdims=True)
    order = np.argsort(-p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, 1)
    cum = np.cumsum(sorted_p, axis=1)
    out: NDArray[np.float64] = np.empty_like(p)
    np.put_along_axis(out, order, cum, 1)  # mass of every class ranked at or above
    if u is not None:
        out = out - u[:, None] * p  # mass strictly above + U * p
    if method == "raps":
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(1, p.shape[1] + 1)[None, :].repeat(len(p), 0), 1)
        out = out + lam * np.maximum(0, rank - k_reg)
    return out


def label_scores(probs: ArrayLike, labels: ArrayLike, method: str = "lac", lam: float = 0.01,
                 k_reg: int = 5, rng: np.random.Generator | None = None) -> NDArray[np.float64]:
    n = np.shape(probs)[0] if np.ndim(probs) == 2 else 0
    s = class_scores(probs, method, lam, k_reg, _uniforms(rng, n))
    y = np.asarray(labels)
    if y.shape != (s.shape[0],) or y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= s.shape[1]:
        raise InputError(f"labels must be {s.shape[0]} integers in [0, {s.shape[1]}), got shape "
                         f"{y.shape} dtype {y.dtype}")
    picked: NDArray[np.float64] = s[np.arange(len(y)), y]
    return picked


def calibrate(probs: ArrayLike, labels: ArrayLike, alpha: float = 0.1, method: str = "lac",
              lam: float = 0.01, k_reg: int = 5, rng: np.random.Generator | None = None) -> float:
    """The conformal quantile: the ceil((n + 1)(1 - alpha))-th smallest calibration score
    (``inf`` when that exceeds n: then every set is every class). ``alpha``: a Python or numpy
    real in (0, 1) (:func:`real_value`; a bool is refused)."""
    a = real_value(alpha)
    if a is None or not 0.0 < a < 1.0:
        raise InputError(f"alpha must be a number in (0, 1), got {alpha!r}")
    alpha = a
    s = np.sort(label_scores(probs, labels, method, lam, k_reg, rng))
    k = math.ceil((len(s) + 1) * (1.0 - alpha))
    return float("inf") if k > len(s) else float(s[k - 1])


def prediction_sets(probs: ArrayLike, qhat: float, method: str = "lac", lam: float = 0.01,
                    k_reg: int = 5, rng: np.random.Generator | None = None, *,
                    nonempty: bool = True) -> NDArray[np.bool_]:
    """[N, C] boolean mask: class c is in sample n's set iff its score <= ``qhat``, or (the
    non-empty rule, ``nonempty=True``: the module docstring) c is the sample's top class, the
    first maximum of its probabilities. ``nonempty=False``: the textbook set, possibly empty."""
    if isinstance(qhat, (bool, np.bool_)) or \
            not isinstance(qhat, (int, float, np.integer, np.floating)) or math.isnan(qhat):
        raise InputError(f"qhat must be a number (from calibrate), got {qhat!r}")
    q = float(qhat)  # as stored: a quantile is a score, not a decimal someone typed
    if not isinstance(nonempty, (bool, np.bool_)):
        raise InputError(f"nonempty must be True or False, got {nonempty!r}")
    n = np.shape(probs)[0] if np.ndim(probs) == 2 else 0
    mask = class_scores(probs, method, lam, k_reg, _uniforms(rng, n)) <= q
    if nonempty:
        add_top(mask, np.asarray(probs).argmax(1))
    return mask


def add_top(mask: NDArray[np.bool_], top: ArrayLike) -> NDArray[np.bool_]:
    """The non-empty rule in place: ``mask[i, top[i]] = True`` for every row (one fancy-index
    store, no Python loop; the runtime's batch path calls it). Returns ``mask``."""
    mask[np.arange(mask.shape[0]), np.asarray(top, np.intp)] = True
    return mask
