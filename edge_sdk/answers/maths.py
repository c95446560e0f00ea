"""The calibrated maths of an answer (the hot path, so inlined rather than through
edge_sdk.answers.metrics): from a configuration's ``[S, C]`` logits, or from the probabilities its
graph computed (edge_sdk.answers.graph), to probabilities, label, confidence, entropy and mutual
information, for one sample and for a batch. Non-finite logits are refused (OutputError).
edge_sdk.answers.prediction builds the answer objects from these."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, NamedTuple, NoReturn, TYPE_CHECKING

import numpy as np

from edge_sdk.errors import OutputError

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def probabilities(c: Configuration, logits: np.ndarray
                  ) -> tuple[list[float], float, float, int, float]:
    """(calibrated mean probabilities, predictive entropy, mutual information, label,
    confidence) from ``[S, C]`` logits, at the configuration's temperature. The maths of
    edge_sdk.answers.metrics (predictive entropy H[mean_s p_s], MI = H[mean p] - mean_s H[p_s]
    clamped at 0); the label is the first maximum of the probabilities."""
    if logits.shape[0] == 1:  # one sample (point): point_top's maths, every field at once
        label, conf, (_, args) = point_top(c, logits)
        probs, entropy = _point_lists(*args)
        return probs, entropy, 0.0, label, conf
    # several rows (head, all): numpy, with as few calls as the maths allows (rows_top)
    top = rows_top(c, logits)
    if top is None:
        probs, entropy, mi = _rows_exact(c, logits)
        conf = max(probs)
        return probs, entropy, mi, probs.index(conf), conf
    p, label, conf, (fn, args) = top
    f = fn(*args)
    return p.tolist(), f["entropy"], f["mutual_info"], label, conf


Lazy = tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]


def point_top(c: Configuration, logits: np.ndarray) -> tuple[int, float, Lazy]:
    """(label, confidence, how to make probs and entropy) of one point sample's ``[1, C]``
    logits: what a call needs at once, to keep the SDK's own time per call low
    (docs/results.md). The probabilities and entropy follow when read (:func:`_point_fields`);
    :func:`probabilities` makes them at once from the same values. Plain floats: several times
    cheaper than numpy on ten classes."""
    inv_t = 1.0 / c.temperature
    row = logits[0].tolist()
    m = max(row)
    e = [math.exp((v - m) * inv_t) for v in row]
    s = sum(e)
    # a NaN or +-inf logit makes the row's sum non-finite (float32 values cannot overflow a
    # float64 sum); the maximum's exp is exactly 1, so a finite row has 1 <= s <= C
    if not (math.isfinite(sum(row)) and s >= 1.0):
        _non_finite(c, logits)
    # the first maximum of the logits is the first maximum of the probabilities (exp is
    # monotone); its probability is exp(0) / s
    return row.index(m), 1.0 / s, (_point_fields, (row, m, e, s, inv_t))


def _point_lists(row: list[float], m: float, e: list[float], s: float, inv_t: float
                 ) -> tuple[list[float], float]:
    """(probs, entropy) of :func:`point_top`'s row: H[p] = log sum e^z - sum p z with z the
    shifted, tempered logits (no log 0), using sum_k p_k = 1."""
    probs = [v / s for v in e]
    entropy = math.log(s) - inv_t * (sum(map(operator.mul, probs, row)) - m)
    return probs, max(entropy, 0.0)


def _point_fields(row: list[float], m: float, e: list[float], s: float, inv_t: float
                  ) -> dict[str, Any]:
    """``probs`` (read-only) and ``entropy`` of :func:`point_top`'s row, when first read
    (``mutual_info`` 0: one row has no epistemic part)."""
    probs, entropy = _point_lists(row, m, e, s, inv_t)
    return {"probs": _readonly(np.array(probs, np.float64)), "entropy": entropy,
            "mutual_info": 0.0}


def lean_top(c: Configuration, logits: np.ndarray
             ) -> tuple[np.ndarray | None, int, float, Lazy] | None:
    """(probs or None, label, confidence, the rest when read) of ``[S, C]`` logits for
    :func:`edge_sdk.answers.prediction.lean_answer`: :func:`point_top` for one row (probs made when read), else
    :func:`rows_top` (None when a row underflows: then :func:`probabilities`)."""
    if len(logits) == 1:
        label, conf, lazy = point_top(c, logits)
        return None, label, conf, lazy
    return rows_top(c, logits)


# _ones and _arange keep up to 32 sizes of at most 8192 (2 MB each at most, whatever batch
# sizes a caller uses; past 32 sizes the cache starts over)
_KEPT, _SIZES = 8192, 32
_ONES: dict[int, np.ndarray] = {}
_ARANGE: dict[int, np.ndarray] = {}


def _keep(cache: dict[int, np.ndarray], n: int, a: np.ndarray) -> np.ndarray:
    if n <= _KEPT:
        if len(cache) >= _SIZES:
            cache.clear()
        cache[n] = a
    return a


def _ones(n: int) -> np.ndarray:
    o = _ONES.get(n)
    if o is None:
        o = _keep(_ONES, n, _readonly(np.ones(n)))
    return o


def _arange(n: int) -> np.ndarray:
    """``0 .. n-1`` (read-only, kept per ``n``): a batch's row index."""
    a = _ARANGE.get(n)
    if a is None:
        a = _keep(_ARANGE, n, _readonly(np.arange(n)))
    return a


def rows_top(c: Configuration, logits: np.ndarray
             ) -> tuple[np.ndarray, int, float, Lazy] | None:
    """(read-only mean probabilities [C], label, confidence, how to make the entropy and
    mutual information: :func:`_rows_fields`) of ``[S, C]`` logits, S > 1: one shift by the
    global maximum, sums as products with ones (a numpy reduction costs ~1 us on [8, 10], an argmax or a
    dot product ~0.3-0.6). None when a row lies so far below the maximum that it underflows:
    then the per-row shift of :func:`_rows_exact`. Non-finite logits are refused."""
    rows, classes = logits.shape
    z = logits.astype(np.float64)
    flat = z.reshape(-1)
    # a NaN or +-inf logit makes the float64 sum non-finite (float32 values cannot overflow it)
    if not math.isfinite(float(np.dot(flat, _ones(flat.size)))):
        _non_finite(c, logits)
    z -= flat.item(flat.argmax())
    z *= 1.0 / c.temperature
    ez = np.exp(z)
    s = np.dot(ez, _ones(classes))  # [S], each >= 1 unless the row underflowed to 0
    ez /= s[:, None]  # p_s
    p = np.dot(_ones(rows), ez)
    p *= 1.0 / rows
    label = int(p.argmax())  # the first maximum; a NaN's index if a row underflowed (0 / 0)
    conf = p.item(label)
    if not math.isfinite(conf):
        return None
    return _readonly(p), label, conf, (_rows_fields, (ez, z, s, p))


def _rows_fields(p_s: np.ndarray, z: np.ndarray, s: np.ndarray, p: np.ndarray
                 ) -> dict[str, Any]:
    """``entropy`` H[mean_s p_s] and ``mutual_info`` H - mean_s H[p_s] (clamped at 0) of
    :func:`rows_top`'s state; H[p_s] = log s - sum_k p_sk z_sk with z the shifted logits."""
    expected = (sum(np.log(s).tolist()) - float(np.vdot(p_s, z))) / len(s)
    entropy = _entropy(p.tolist())
    return {"entropy": entropy, "mutual_info": max(entropy - expected, 0.0)}


def _entropy(probs: list[float]) -> float:
    """-sum p log p (nats, 0 log 0 = 0), clamped at 0: a few Python floats, cheaper than numpy."""
    return max(-sum([v * math.log(v) for v in probs if v > 0.0]), 0.0)


def answer_top(c: Configuration, p: np.ndarray, logits: np.ndarray | None
               ) -> tuple[np.ndarray | None, int, float, Lazy] | None:
    """:func:`lean_top` of a slice whose graph computed the answer (:mod:`edge_sdk.answers.graph`):
    ``p`` its mean tempered probabilities ``[1, C]`` (float32), ``logits`` the head's ``[S, C]``
    rows (None for a point: its fields need only ``p``). None when ``p`` holds a NaN, i.e. a
    logit was not finite (the graph's guard; ``argmax`` returns a NaN's index when there is
    one): the caller refuses the call with the logits."""
    label = int(p.argmax())  # the first maximum, as the Python path's
    conf = p.item(label)
    if conf != conf:
        return None
    if logits is None:
        return None, label, conf, (_answer_point_fields, (p,))
    # a head's probs are made when read too (three numpy calls, ~5-10 us right
    # after a wide invoke); its logits are copied now, the next invoke overwrites them
    return None, label, conf, (_answer_rows_fields, (c, p, logits))


def _answer_point_fields(p: np.ndarray) -> dict[str, Any]:
    """``probs`` (read-only float64) and ``entropy`` -sum p log p of the graph's answer
    (``mutual_info`` 0: a point)."""
    probs = _readonly(p.reshape(-1).astype(np.float64))
    return {"probs": probs, "entropy": _entropy(probs.tolist()), "mutual_info": 0.0}


def _answer_rows_fields(c: Configuration, p: np.ndarray, logits: np.ndarray
                        ) -> dict[str, Any]:
    """``probs`` (the graph's answer, read-only float64), and ``entropy`` and ``mutual_info``
    of a head's rows, in float64 from its logits by :func:`probabilities` (so rows that agree
    have exactly none)."""
    _, entropy, mi, _, _ = probabilities(c, logits)
    return {"probs": _readonly(p.reshape(-1).astype(np.float64)), "entropy": entropy,
            "mutual_info": mi}


def _rows_exact(c: Configuration, logits: np.ndarray) -> tuple[list[float], float, float]:
    """:func:`probabilities` of several rows, each shifted by its own maximum (the general
    path: no row underflows); non-finite logits are refused."""
    z = logits.astype(np.float64) * (1.0 / c.temperature)
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    s = e.sum(-1, keepdims=True)
    p_s = e / s
    expected = float((np.log(s[:, 0]) - (p_s * z).sum(-1)).mean())
    p = p_s.mean(0)
    entropy = float(-(p * np.log(np.where(p > 0, p, 1.0))).sum())
    if not (math.isfinite(entropy) and math.isfinite(expected) and np.isfinite(p).all()):
        _non_finite(c, logits)
    return p.tolist(), entropy, max(entropy - expected, 0.0)


_ADDR = np.add.reduce


def _non_finite(c: Configuration, logits: np.ndarray) -> NoReturn:
    """NaN or inf logits (weights a check could not rule out, e.g. finite ones that
    overflow float32 together) are refused, never answered as NaN probabilities, label 0."""
    bad = int((~np.isfinite(np.asarray(logits, np.float64))).sum())
    raise OutputError(f"configuration {c.id!r} answered non-finite values ({bad} of "
                      f"{np.asarray(logits).size} logits NaN or infinite, temperature "
                      f"{c.temperature:g}): its slice or manifest is broken; refusing to answer")


class BatchProbs(NamedTuple):
    """:func:`batch_probabilities` of ``n`` samples: read-only ``probs [n, C]`` float64, the
    first maximum's ``labels [n]`` and ``confidence [n]``; ``entropy`` and ``mutual_info``
    ``[n]`` are computed when first read (:meth:`edge_sdk.answers.prediction.BatchPrediction.entropy`)."""

    probs: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    p_s: np.ndarray | None  # [n, S, C] per-sample-row probabilities (S > 1), for the MI
    z: np.ndarray | None  # their shifted, tempered logits [n, S, C] (S > 1)
    s: np.ndarray | None  # their softmax denominators [n, S] (S > 1)
    # a head batch answered by its graph (batch_answer): its configuration and
    # logits [n, S, C], from which the entropy and MI are computed in float64 when read
    rows: tuple[Configuration, np.ndarray] | None = None


def batch_probabilities(c: Configuration, logits: np.ndarray) -> BatchProbs:
    """The calibrated probabilities of ``[n, S, C]`` logits in one numpy pass (predict_batch:
    the goal is <= 1.1x the raw batched invoke, so per-sample Python is out)."""
    n, rows, classes = logits.shape
    # a NaN or +-inf logit makes the float64 sum of all of them non-finite (float32 values
    # cannot overflow it): refused as one call's are (-inf too: its softmax would be finite)
    if not math.isfinite(float(_ADDR(logits.reshape(-1), dtype=np.float64))):
        _non_finite(c, logits)
    if rows == 1:
        # a reduction along a short last axis costs 2-4 us on [64, 10] here, so the
        # row maximum comes from the argmax (needed anyway) and the row sum from a product
        # with ones; the maximum's exp is exactly 1, so its probability is 1 / sum
        x = logits.reshape(n, classes)
        labels = x.argmax(1)  # the first maximum, as probabilities(); a NaN row's NaN
        z = x.astype(np.float64)
        top = z[np.arange(n), labels]
        # every logit finite: z <= 0 after the shift, so the sums below lie in [1, C]
        z -= top[:, None]
        z *= 1.0 / c.temperature
        p = np.exp(z)
        s = np.dot(p, np.ones(classes))
        conf = 1.0 / s
        p *= conf[:, None]
        for a in (p, labels, conf):
            a.setflags(write=False)
        return BatchProbs(p, labels, conf, None, None, None)
    z = logits.astype(np.float64)
    z *= 1.0 / c.temperature
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    s_rows = e.sum(-1)
    p_s = e / s_rows[..., None]  # [n, S, C]
    p = p_s.mean(1)
    labels = p.argmax(1)  # the first maximum, as probabilities()
    conf = p[np.arange(n), labels]
    for a in (p, labels, conf):
        a.setflags(write=False)
    return BatchProbs(p, labels, conf, p_s, z, s_rows)


def batch_answer(c: Configuration, p: np.ndarray, logits: np.ndarray | None
                 ) -> BatchProbs | None:
    """:func:`batch_probabilities` of a batch whose graph computed the answer
    (:mod:`edge_sdk.answers.graph`): ``p`` its mean tempered probabilities ``[n, C]``
    (float32), ``logits`` ``[n, S, C]``, read only for a head's entropy and MI (None for a
    point). None when a row holds a NaN (the graph's guard: a logit was not finite; ``argmax``
    stops at a NaN, so the sum of the confidences exposes it): the caller refuses the batch
    with the logits, as :func:`batch_probabilities` refuses them."""
    # on the float64 copy (exact, monotone): the first maximum, as the numpy path's, and its
    # value by indexing, its sum as a dot product (each numpy call costs ~3x its warm
    # time right after a batched invoke has evicted the caches; measured cold on [64, 10]:
    # max(1) 7.1 us, this indexing 5.1; add.reduce 4.1, the dot product 2.4)
    n = len(p)
    probs = p.astype(np.float64)
    labels = probs.argmax(1)
    conf = probs[_arange(n), labels]
    if not math.isfinite(conf.dot(_ones(n))):
        return None
    probs.setflags(write=False)
    labels.setflags(write=False)
    conf.setflags(write=False)
    return BatchProbs(probs, labels, conf, None, None, None,
                      None if logits is None or logits.shape[1] == 1 else (c, logits))


def batch_entropy(bp: BatchProbs) -> tuple[np.ndarray, np.ndarray]:
    """(predictive entropy [n], mutual information [n]) of :func:`batch_probabilities` (or
    :func:`batch_answer`'s: a head's from its logits in float64, so rows that agree have
    exactly none)."""
    if bp.rows is not None:
        return batch_entropy(batch_probabilities(*bp.rows))
    p = bp.probs
    entropy = np.maximum(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1), 0.0)
    p_s, z, s = bp.p_s, bp.z, bp.s
    if p_s is None or z is None or s is None:  # (all set, or none)
        mi = np.zeros(len(p))
    else:
        expected = (np.log(s) - (p_s * z).sum(-1)).mean(-1)
        mi = np.maximum(entropy - expected, 0.0)
    return entropy, mi
