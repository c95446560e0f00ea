"""The answer to one sample: :class:`Prediction`, and the calibrated maths that makes it from
a configuration's ``[S, C]`` logits (the hot path, so inlined rather than through metrics)."""
from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import (TYPE_CHECKING, Any, Callable, Generic, NamedTuple, NoReturn, TypeVar,
                    overload)

import numpy as np

from edge_sdk.bundle import Configuration
from edge_sdk.errors import OutputError


_new = object.__new__


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Prediction:
    """One sample's answer. Immutable: ``probs`` is a read-only float64 numpy array ``[C]``
    (``p.probs[0] = 1`` raises ``ValueError``), every other field a plain Python value.

    Equality and hashing (defined here, since numpy arrays have neither as a value): two
    predictions are equal when every field is, ``probs`` compared exactly element by element
    (:func:`numpy.array_equal`); the hash is that of the fields with ``probs`` as a tuple of
    floats, so equal predictions hash alike and predictions can be set members or dict keys.
    Predictions of two calls are rarely equal (``latency_ms`` differs): compare the fields
    you mean, e.g. ``np.allclose(a.probs, b.probs)``. :meth:`to_dict` gives plain Python
    values (``probs`` a list of floats), what ``edge-sdk run --json`` prints."""

    label: int
    class_name: str
    probs: np.ndarray  # [C] float64, read-only: calibrated (the configuration's T), averaged
    confidence: float  # max of probs
    entropy: float  # predictive entropy H[mean_s p_s] (nats)
    mutual_info: float  # predictive - expected entropy, >= 0 (0 for a point configuration)
    abstain: bool  # confidence below the threshold exported for the target accuracy
    width: float
    scope: str
    samples: int
    config_id: str
    # wall time of the whole predict() / predict_batch() call: what the app waited (a batch's
    # predictions all carry the batch's time); the policy learns it and the budget judges it
    latency_ms: float
    budget_met: bool  # memory fitted and latency_ms within the latency budget
    invoke_ms: float = 0.0  # the interpreter part of latency_ms (every stage, every invoke)
    batch_size: int = 1  # samples answered by the call this prediction came from
    # (issue 33; None when the bundle has no uncertainty.bin, the configuration is of the
    # all scope, or load(uncertainty=False))
    # out-of-distribution score of the answering slice's features: minus the cosine
    # similarity to the k-th nearest training image's (higher = less like the training data)
    ood_score: float | None = None
    # ood_score at or below the threshold that accepts 95 % of in-distribution validation
    # images; False also makes ``abstain`` true (load(abstain_on_ood=False) turns that off)
    in_distribution: bool | None = None
    # split-conformal set at the model's alpha: class indices that hold the true class with
    # probability >= 1 - alpha (marginally, over calls), calibrated on validation
    prediction_set: tuple[int, ...] | None = None
    # (issue 34) the sample's raw statistics (per channel: mean and maximum) fall outside
    # what the training split's samples span, widened by the manifest's stated margin: e.g.
    # an image scaled to [0, 1] for a bundle trained on [0, 16]. True also makes ``abstain``
    # true (with abstain_on_ood). None: the bundle carries no input statistics (schema < 6)
    # or load(input_check=False)
    input_suspect: bool | None = None

    if not TYPE_CHECKING:  # (mypy keeps flagging misspelt attributes)
        def __getattr__(self, name: str) -> Any:
            # (issue 34) an answer made by lean_answer() computes ``probs`` and ``entropy``
            # (point) or ``entropy`` and ``mutual_info`` (head) when first read: 1-3 us of a
            # call that reads only label and confidence; every field is then a plain
            # attribute, as for any other prediction
            d = self.__dict__
            lazy = d.get("_lazy")
            if lazy is None or name not in _LAZY:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            fn, args = lazy
            d.update(fn(*args))
            del d["_lazy"]
            return d[name]

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (JSON-ready: ``probs`` a list of floats)."""
        d = {f: getattr(self, f) for f in _FIELDS}
        d["probs"] = self.probs.tolist()
        return d

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        for f in _FIELDS:
            a, b = getattr(self, f), getattr(other, f)
            if not (np.array_equal(a, b) if f == "probs" else a == b):
                return False
        return True

    def __hash__(self) -> int:
        return hash(tuple(tuple(self.probs.tolist()) if f == "probs" else getattr(self, f)
                          for f in _FIELDS))


_FIELDS = tuple(f.name for f in fields(Prediction))
_LAZY = frozenset({"probs", "entropy", "mutual_info"})


def probabilities(c: Configuration, logits: np.ndarray
                  ) -> tuple[list[float], float, float, int, float]:
    """(calibrated mean probabilities, predictive entropy, mutual information, label,
    confidence) from ``[S, C]`` logits, at the configuration's temperature. The maths of
    edge_sdk.metrics (predictive entropy H[mean_s p_s], MI = H[mean p] - mean_s H[p_s]
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
    logits: what a call needs at once (issue 34: the SDK's microseconds). The probabilities
    and entropy follow when read (:func:`_point_fields`); :func:`probabilities` makes them at
    once from the same values. Plain floats: several times cheaper than numpy on ten classes."""
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
    """``probs`` (read-only) and ``entropy`` of :func:`point_top`'s row, when first read."""
    probs, entropy = _point_lists(row, m, e, s, inv_t)
    return {"probs": _readonly(np.array(probs, np.float64)), "entropy": entropy}


def lean_top(c: Configuration, logits: np.ndarray
             ) -> tuple[np.ndarray | None, int, float, Lazy] | None:
    """(probs or None, label, confidence, the rest when read) of ``[S, C]`` logits for
    :func:`lean_answer`: :func:`point_top` for one row (probs made when read), else
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
    global maximum, sums as products with ones (issue 34: a numpy reduction costs ~1 us on [8, 10], an argmax or a
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
    """:func:`lean_top` of a slice whose graph computed the answer (:mod:`edge_sdk.answer_graph`):
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
    probs = _readonly(p.reshape(-1).astype(np.float64))
    return probs, label, conf, (_answer_rows_fields, (c, logits))


def _answer_point_fields(p: np.ndarray) -> dict[str, Any]:
    """``probs`` (read-only float64) and ``entropy`` -sum p log p of the graph's answer."""
    probs = _readonly(p.reshape(-1).astype(np.float64))
    return {"probs": probs, "entropy": _entropy(probs.tolist())}


def _answer_rows_fields(c: Configuration, logits: np.ndarray) -> dict[str, Any]:
    """``entropy`` and ``mutual_info`` of a head's rows, in float64 from its logits by
    :func:`probabilities` (so rows that agree have exactly none)."""
    _, entropy, mi, _, _ = probabilities(c, logits)
    return {"entropy": entropy, "mutual_info": mi}


def eager_fields(top: tuple[np.ndarray | None, int, float, Lazy]
                 ) -> tuple[list[float], float, float, int, float]:
    """:func:`probabilities`' five values from a lean answer's parts, every field made now."""
    probs, label, conf, (fn, args) = top
    f = fn(*args)
    return ((f["probs"] if probs is None else probs).tolist(), f["entropy"],
            f.get("mutual_info", 0.0), label, conf)


def lean_answer(c: Configuration, labels: Sequence[str], label: int, confidence: float,
                lazy: Lazy, abstain: bool,
                latency_ms: float, invoke_ms: float, met: bool, input_suspect: bool | None,
                probs: np.ndarray | None = None) -> Prediction:
    """:func:`answer` of a one-sample call without uncertainty statistics, the fields
    ``lazy`` computes (``(function, arguments)``) made when first read
    (``Prediction.__getattr__``): a point's probs and entropy, a head's entropy and mutual
    information (its ``probs`` given)."""
    p = _new(Prediction)
    d = p.__dict__
    d.update(label=label, class_name=labels[label], _lazy=lazy, confidence=confidence,
             abstain=abstain, width=c.width, scope=c.scope, samples=c.samples,
             config_id=c.id, latency_ms=latency_ms, budget_met=met, invoke_ms=invoke_ms,
             batch_size=1, ood_score=None, in_distribution=None, prediction_set=None,
             input_suspect=input_suspect)
    if probs is None:
        d["mutual_info"] = 0.0  # a point answer has no epistemic part
    else:
        d["probs"] = probs
    return p


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
    """(issue 36) NaN or inf logits (weights a check could not rule out, e.g. finite ones that
    overflow float32 together) are refused, never answered as NaN probabilities, label 0."""
    bad = int((~np.isfinite(np.asarray(logits, np.float64))).sum())
    raise OutputError(f"configuration {c.id!r} answered non-finite values ({bad} of "
                      f"{np.asarray(logits).size} logits NaN or infinite, temperature "
                      f"{c.temperature:g}): its slice or manifest is broken; refusing to answer")


# a Draft's probabilities: a list (one sample, :func:`draft`) or a read-only row (a batch,
# :func:`draft_batch`)
P = TypeVar("P", list[float], np.ndarray)


@dataclass
class Draft(Generic[P]):
    """An answer before the call's end-to-end time is known (a cascade's stages)."""

    config: Configuration
    probs: P
    entropy: float
    mutual_info: float
    label: int
    confidence: float
    ood_score: float | None = None
    in_distribution: bool | None = None
    prediction_set: tuple[int, ...] | None = None
    input_suspect: bool | None = None


def draft(c: Configuration, logits: np.ndarray) -> Draft[list[float]]:
    return Draft(c, *probabilities(c, logits))


class BatchProbs(NamedTuple):
    """:func:`batch_probabilities` of ``n`` samples: read-only ``probs [n, C]`` float64, the
    first maximum's ``labels [n]`` and ``confidence [n]``; ``entropy`` and ``mutual_info``
    ``[n]`` are computed when first read (:meth:`BatchPrediction.entropy`)."""

    probs: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    p_s: np.ndarray | None  # [n, S, C] per-sample-row probabilities (S > 1), for the MI
    z: np.ndarray | None  # their shifted, tempered logits [n, S, C] (S > 1)
    s: np.ndarray | None  # their softmax denominators [n, S] (S > 1)
    # (issue 34) a head batch answered by its graph (batch_answer): its configuration and
    # logits [n, S, C], from which the entropy and MI are computed in float64 when read
    rows: tuple[Configuration, np.ndarray] | None = None


def batch_probabilities(c: Configuration, logits: np.ndarray) -> BatchProbs:
    """The calibrated probabilities of ``[n, S, C]`` logits in one numpy pass (predict_batch:
    issue 34 asks for <= 1.1x the raw batched invoke, so per-sample Python is out)."""
    n, rows, classes = logits.shape
    # a NaN or +-inf logit makes the float64 sum of all of them non-finite (float32 values
    # cannot overflow it): refused as one call's are (-inf too: its softmax would be finite)
    if not math.isfinite(float(_ADDR(logits.reshape(-1), dtype=np.float64))):
        _non_finite(c, logits)
    if rows == 1:
        # (issue 34) a reduction along a short last axis costs 2-4 us on [64, 10] here, so the
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
    (:mod:`edge_sdk.answer_graph`): ``p`` its mean tempered probabilities ``[n, C]``
    (float32), ``logits`` ``[n, S, C]``, read only for a head's entropy and MI (None for a
    point). None when a row holds a NaN (the graph's guard: a logit was not finite; ``argmax``
    stops at a NaN, so the sum of the confidences exposes it): the caller refuses the batch
    with the logits, as :func:`batch_probabilities` refuses them."""
    # on the float64 copy (exact, monotone): the first maximum, as the numpy path's, and its
    # value by indexing, its sum as a dot product (issue 34: each numpy call costs ~3x its warm
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


def draft_batch(c: Configuration, logits: np.ndarray) -> list[Draft[np.ndarray]]:
    """:func:`draft` of every sample of ``[n, S, C]`` logits (a cascade's stages)."""
    bp = batch_probabilities(c, logits)
    entropy, mi = batch_entropy(bp)
    return [Draft(c, row, h, m, lab, cf) for row, h, m, lab, cf in
            zip(bp.probs, entropy.tolist(), mi.tolist(), bp.labels.tolist(),
                bp.confidence.tolist())]


def abstains(c: Configuration, target: str, confidence: float, in_distribution: bool | None,
             input_suspect: bool | None, abstain_on_ood: bool) -> bool:
    """The default abstention rule: abstain when the confidence is below the threshold
    exported for the target accuracy, or (``abstain_on_ood``) the input is unlike the training
    data: out of distribution by the OOD score, or its raw statistics are suspect (issue 34;
    so the two never contradict each other: either one makes the call abstain)."""
    threshold = c.thresholds[target]
    return threshold is None or confidence < threshold or (abstain_on_ood and (
        in_distribution is False or input_suspect is True))


def answer(c: Configuration, labels: Sequence[str], probs: list[float] | np.ndarray,
           entropy: float, mutual_info: float, label: int, confidence: float, abstain: bool,
           latency_ms: float, invoke_ms: float, met: bool, batch_size: int = 1,
           ood_score: float | None = None, in_distribution: bool | None = None,
           prediction_set: tuple[int, ...] | None = None, input_suspect: bool | None = None
           ) -> Prediction:
    """A :class:`Prediction` from its fields (``probs``: a list, made a read-only array here,
    or a read-only row already)."""
    if probs.__class__ is list:
        probs = np.array(probs, np.float64)
        probs.setflags(write=False)
    # (issue 34) built without the frozen dataclass' __init__ (20 object.__setattr__ calls,
    # 2-3 us a call): the same fields, in the same order
    p = _new(Prediction)
    p.__dict__.update(
        label=label, class_name=labels[label], probs=probs,
        confidence=confidence, entropy=entropy, mutual_info=mutual_info,
        abstain=abstain, width=c.width, scope=c.scope,
        samples=c.samples, config_id=c.id, latency_ms=latency_ms, budget_met=met,
        invoke_ms=invoke_ms, batch_size=batch_size, ood_score=ood_score,
        in_distribution=in_distribution, prediction_set=prediction_set,
        input_suspect=input_suspect)
    return p


def finish(d: Draft[list[float]] | Draft[np.ndarray], labels: Sequence[str], target: str, latency_ms: float,
           invoke_ms: float, met: bool, batch_size: int = 1, abstain_on_ood: bool = True
           ) -> Prediction:
    """The :class:`Prediction` of a draft, with the default abstention rule
    (:func:`abstains`)."""
    c = d.config
    return answer(c, labels, d.probs, d.entropy, d.mutual_info, d.label, d.confidence,
                  abstains(c, target, d.confidence, d.in_distribution, d.input_suspect,
                           abstain_on_ood),
                  latency_ms, invoke_ms, met, batch_size, d.ood_score, d.in_distribution,
                  d.prediction_set, d.input_suspect)


class BatchPrediction(Sequence[Prediction]):
    """What ``predict_batch`` answers: the batch as read-only numpy arrays, as LiteRT and
    torch-uncertainty hand them back — ``labels [N]``, ``confidence [N]``, ``probs [N, C]``,
    ``abstain [N]``, ``entropy [N]``, ``mutual_info [N]``, and (None without the statistics
    they need) ``ood_score [N]``, ``in_distribution [N]``, ``prediction_sets [N, C]``
    (boolean mask) and ``input_suspect [N]`` — and a sequence of :class:`Prediction`
    (indexing, iterating and ``len`` work as on the list it used to be). The per-sample
    :class:`Prediction` objects are made on first use (issue 34: making 64 of them cost more
    than a small batched invoke)."""

    def __init__(self, preds: list[Prediction], classes: int):
        """From per-sample predictions (a cascade's batch, whose samples differ in who
        answered)."""
        self._preds: list[Prediction] | None = list(preds)
        self._make: Callable[[int], Prediction] | None = None
        ps = self._preds
        n = self._n = len(ps)
        self.labels = _readonly(np.fromiter((p.label for p in ps), np.int64, n))
        self.confidence = _readonly(np.fromiter((p.confidence for p in ps), np.float64, n))
        self.probs = _readonly(np.asarray([p.probs for p in ps], np.float64)
                         .reshape(n, classes))  # one copy: a cascade mixes stages' rows
        self.abstain = _readonly(np.fromiter((p.abstain for p in ps), bool, n))
        self._entropy: np.ndarray | None = _readonly(
            np.fromiter((p.entropy for p in ps), np.float64, n))
        self._mi: np.ndarray | None = _readonly(np.fromiter((p.mutual_info for p in ps), np.float64, n))
        self._bp: BatchProbs | None = None
        scored = n > 0 and all(p.ood_score is not None for p in ps)
        self.ood_score = _readonly(np.fromiter((p.ood_score for p in ps), np.float64, n)) \
            if scored else None
        self.in_distribution = _readonly(np.fromiter((p.in_distribution for p in ps), bool, n)) \
            if scored else None
        self.prediction_sets: np.ndarray | None = None
        if n and all(p.prediction_set is not None for p in ps):
            mask = np.zeros((n, classes), bool)
            for i, p in enumerate(ps):
                if p.prediction_set is not None:  # (all are)
                    mask[i, list(p.prediction_set)] = True
            self.prediction_sets = _readonly(mask)
        self.input_suspect = _readonly(np.fromiter((p.input_suspect for p in ps), bool, n)) \
            if n and all(p.input_suspect is not None for p in ps) else None

    @classmethod
    def of_one(cls, c: Configuration, labels: Sequence[str], bp: BatchProbs,
               abstain: np.ndarray, latency_ms: float, invoke_ms: float, met: bool,
               ood_score: np.ndarray | None = None, in_distribution: np.ndarray | None = None,
               prediction_sets: np.ndarray | None = None,
               input_suspect: np.ndarray | None = None) -> BatchPrediction:
        """A batch one configuration answered, from its arrays (no per-sample work)."""
        self = cls.__new__(cls)
        self._preds, self._bp = None, bp
        self._n = n = len(bp.labels)
        self.labels, self.confidence, self.probs = bp.labels, bp.confidence, bp.probs
        self.abstain = _readonly(abstain)
        self._entropy = self._mi = None
        self.ood_score = None if ood_score is None else _readonly(ood_score)
        self.in_distribution = None if in_distribution is None else _readonly(in_distribution)
        self.prediction_sets = None if prediction_sets is None else _readonly(prediction_sets)
        self.input_suspect = None if input_suspect is None else _readonly(input_suspect)

        def make(i: int) -> Prediction:
            lab = int(self.labels[i])
            return answer(
                c, labels, self.probs[i], float(self.entropy[i]), float(self.mutual_info[i]),
                lab, float(self.confidence[i]), bool(self.abstain[i]), latency_ms, invoke_ms,
                met, n, None if self.ood_score is None else float(self.ood_score[i]),
                None if self.in_distribution is None else bool(self.in_distribution[i]),
                None if self.prediction_sets is None else
                tuple(np.flatnonzero(self.prediction_sets[i]).tolist()),
                None if self.input_suspect is None else bool(self.input_suspect[i]))

        self._make = make
        return self

    @property
    def entropy(self) -> np.ndarray:
        """Predictive entropy ``[N]`` (nats), computed on first read."""
        return self._entropies()[0]

    @property
    def mutual_info(self) -> np.ndarray:
        """Mutual information ``[N]`` (0 for point configurations), computed on first read."""
        return self._entropies()[1]

    def _entropies(self) -> tuple[np.ndarray, np.ndarray]:
        entropy, mi = self._entropy, self._mi
        if entropy is None or mi is None:  # of_one's batch: from its BatchProbs
            bp = self._bp
            assert bp is not None  # (set by of_one, the only place these start as None)
            entropy, mi = map(_readonly, batch_entropy(bp))
            self._entropy, self._mi = entropy, mi
        return entropy, mi

    def _list(self) -> list[Prediction]:
        if self._preds is None:
            make = self._make
            assert make is not None  # (of_one sets it with _preds None)
            self._preds = [make(i) for i in range(self._n)]
        return self._preds

    @overload
    def __getitem__(self, i: int) -> Prediction: ...
    @overload
    def __getitem__(self, i: slice) -> list[Prediction]: ...
    def __getitem__(self, i: int | slice) -> Prediction | list[Prediction]:
        return self._list()[i]

    def __iter__(self) -> Iterator[Prediction]:
        return iter(self._list())

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        """Equal to a BatchPrediction or a list with the same predictions in order."""
        if isinstance(other, BatchPrediction):
            return self._list() == other._list()
        if isinstance(other, list):
            return self._list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container, like a list

    def __add__(self, other: Iterable[Prediction]) -> list[Prediction]:
        # list + batch and batch + list, as with the list it was
        return self._list() + list(other)

    def __radd__(self, other: Iterable[Prediction]) -> list[Prediction]:
        return list(other) + self._list()

    def __repr__(self) -> str:
        return f"BatchPrediction(n={self._n}, labels={self.labels.tolist()!r})"

