"""The answer to one sample: :class:`Prediction`, and the calibrated maths that makes it from
a configuration's ``[S, C]`` logits (the hot path, so inlined rather than through metrics)."""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields

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

    def to_dict(self) -> dict:
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


def probabilities(c: Configuration, logits: np.ndarray) -> tuple[list[float], float, float]:
    """(calibrated mean probabilities, predictive entropy, mutual information) from ``[S, C]``
    logits, at the configuration's temperature. The maths of edge_sdk.metrics (predictive
    entropy H[mean_s p_s], MI = H[mean p] - mean_s H[p_s] clamped at 0)."""
    inv_t = 1.0 / c.temperature
    if logits.shape[0] == 1:
        # one sample (point): plain floats, several times cheaper than numpy on ten classes;
        # H[p] = log sum e^z - sum p z with z the shifted logits (no log 0)
        row = logits[0].tolist()
        m = max(row)
        e = [math.exp((v - m) * inv_t) for v in row]
        s = sum(e)
        probs = [v / s for v in e]
        # sum_k p_k z_k with z = (row - m) / T, using sum_k p_k = 1
        entropy = math.log(s) - inv_t * (sum(map(operator.mul, probs, row)) - m) if s > 0 \
            else math.nan
        if not (math.isfinite(entropy) and math.isfinite(s)):  # NaN or inf in: never NaN out
            _non_finite(c, logits)
        return probs, max(entropy, 0.0), 0.0
    # several rows (head, all): numpy, with as few calls as the maths allows (issue 34: a
    # reduction costs ~1 us on [8, 10] and keepdims twice that): one shift by the global
    # maximum (a row far below it underflows: then the per-row shift of _rows_exact)
    rows = logits.shape[0]
    z = logits.astype(np.float64)
    z *= inv_t
    z -= float(_MAXR(z, axis=None))
    e = np.exp(z)
    s = _ADDR(e, 1)
    e /= s[:, None]  # p_s, [S, C]
    expected = (sum(np.log(s).tolist()) - float(np.vdot(e, z))) / rows
    if not math.isfinite(expected):
        return _rows_exact(c, logits)
    probs = (_ADDR(e, 0) * (1.0 / rows)).tolist()
    entropy = -sum([v * math.log(v) for v in probs if v > 0.0])
    if not math.isfinite(sum(probs)):
        _non_finite(c, logits)
    return probs, max(entropy, 0.0), max(entropy - expected, 0.0)


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


_MAXR, _ADDR = np.maximum.reduce, np.add.reduce


def _non_finite(c: Configuration, logits: np.ndarray):
    """(issue 36) NaN or inf logits (weights a check could not rule out, e.g. finite ones that
    overflow float32 together) are refused, never answered as NaN probabilities, label 0."""
    bad = int((~np.isfinite(np.asarray(logits, np.float64))).sum())
    raise OutputError(f"configuration {c.id!r} answered non-finite values ({bad} of "
                      f"{np.asarray(logits).size} logits NaN or infinite, temperature "
                      f"{c.temperature:g}): its slice or manifest is broken; refusing to answer")


@dataclass
class Draft:
    """An answer before the call's end-to-end time is known."""

    config: Configuration
    probs: list[float] | np.ndarray  # a list (one sample) or a read-only row (a batch)
    entropy: float
    mutual_info: float
    label: int
    confidence: float
    ood_score: float | None = None
    in_distribution: bool | None = None
    prediction_set: tuple[int, ...] | None = None


def draft(c: Configuration, logits: np.ndarray) -> Draft:
    probs, entropy, mi = probabilities(c, logits)
    top = max(probs)
    return Draft(c, probs, entropy, mi, probs.index(top), top)  # the first maximum


def draft_batch(c: Configuration, logits: np.ndarray) -> list[Draft]:
    """:func:`draft` of every sample of ``[n, S, C]`` logits in one numpy pass (predict_batch:
    per-sample Python would cost more than the batched invoke saves)."""
    z = logits.astype(np.float64) * (1.0 / c.temperature)
    z -= z.max(-1, keepdims=True)
    e = np.exp(z)
    s = e.sum(-1, keepdims=True)
    p_s = e / s  # [n, S, C]
    p = p_s.mean(1)  # [n, C]
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    if logits.shape[1] == 1:
        mi = np.zeros(len(p))
        entropy = np.maximum(entropy, 0.0)
    else:
        expected = (np.log(s[..., 0]) - (p_s * z).sum(-1)).mean(-1)
        mi = np.maximum(entropy - expected, 0.0)
    if not (np.isfinite(entropy).all() and np.isfinite(p).all() and np.isfinite(mi).all()):
        _non_finite(c, logits)
    labels = p.argmax(-1)  # the first maximum, as draft()
    _readonly(p)  # each prediction's probs: a read-only row of it
    conf = p[np.arange(len(p)), labels].tolist()
    return [Draft(c, row, h, m, lab, cf) for row, h, m, lab, cf in
            zip(p, entropy.tolist(), mi.tolist(), labels.tolist(), conf)]


def finish(d: Draft, labels: tuple[str, ...] | list[str], target: str, latency_ms: float,
           invoke_ms: float, met: bool, batch_size: int = 1, abstain_on_ood: bool = True
           ) -> Prediction:
    """The default abstention rule: abstain when the confidence is below the threshold
    exported for the target accuracy, or (``abstain_on_ood``) the input is out of
    distribution."""
    c = d.config
    threshold = c.thresholds[target]
    abstain = threshold is None or d.confidence < threshold or \
        (abstain_on_ood and d.in_distribution is False)
    probs = d.probs
    if probs.__class__ is list:
        probs = np.array(probs)
        probs.setflags(write=False)
    # (issue 34) built without the frozen dataclass' __init__ (19 object.__setattr__ calls,
    # 2-3 us a call): the same fields, in the same order
    p = _new(Prediction)
    p.__dict__.update(
        label=d.label, class_name=labels[d.label], probs=probs,
        confidence=d.confidence, entropy=d.entropy, mutual_info=d.mutual_info,
        abstain=abstain, width=c.width, scope=c.scope,
        samples=c.samples, config_id=c.id, latency_ms=latency_ms, budget_met=met,
        invoke_ms=invoke_ms, batch_size=batch_size, ood_score=d.ood_score,
        in_distribution=d.in_distribution, prediction_set=d.prediction_set)
    return p


class BatchPrediction(Sequence):
    """What ``predict_batch`` answers: a sequence of :class:`Prediction` (indexing, iterating
    and ``len`` work as on the list it used to be) plus the batch as read-only numpy arrays,
    as LiteRT and torch-uncertainty hand them back: ``labels [N]``, ``confidence [N]``,
    ``probs [N, C]``, ``abstain [N]``, and (issue 33, None without uncertainty statistics)
    ``ood_score [N]``, ``in_distribution [N]`` and ``prediction_sets [N, C]`` (boolean mask)."""

    def __init__(self, preds: list[Prediction], classes: int):
        self._preds = list(preds)
        n = len(self._preds)

        def ro(a: np.ndarray) -> np.ndarray:
            a.setflags(write=False)
            return a

        self.labels = ro(np.fromiter((p.label for p in self._preds), np.int64, n))
        self.confidence = ro(np.fromiter((p.confidence for p in self._preds), np.float64, n))
        self.probs = ro(np.asarray([p.probs for p in self._preds], np.float64)
                        .reshape(n, classes))  # one copy: a cascade mixes stages' rows
        self.abstain = ro(np.fromiter((p.abstain for p in self._preds), bool, n))
        scored = n > 0 and all(p.ood_score is not None for p in self._preds)
        self.ood_score = ro(np.fromiter((p.ood_score for p in self._preds), np.float64, n)) \
            if scored else None
        self.in_distribution = ro(np.fromiter((p.in_distribution for p in self._preds), bool,
                                              n)) if scored else None
        self.prediction_sets = None
        if n and all(p.prediction_set is not None for p in self._preds):
            mask = np.zeros((n, classes), bool)
            for i, p in enumerate(self._preds):
                mask[i, list(p.prediction_set)] = True
            self.prediction_sets = ro(mask)

    def __getitem__(self, i):
        return self._preds[i]

    def __len__(self) -> int:
        return len(self._preds)

    def __eq__(self, other: object) -> bool:
        """Equal to a BatchPrediction or a list with the same predictions in order."""
        if isinstance(other, BatchPrediction):
            return self._preds == other._preds
        if isinstance(other, list):
            return self._preds == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container, like a list

    def __add__(self, other):  # list + batch and batch + list, as with the list it was
        return self._preds + list(other)

    def __radd__(self, other):
        return list(other) + self._preds

    def __repr__(self) -> str:
        return f"BatchPrediction(n={len(self._preds)}, labels={self.labels.tolist()!r})"
