"""The answer to one sample, :class:`Prediction`, and to a batch, :class:`BatchPrediction`;
a cascade's :class:`Draft`; the default abstention rule. The maths that fills them is
edge_sdk.answers.maths."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar, overload

import numpy as np

from edge_sdk.answers.batch_call import BatchCall
from edge_sdk.answers.maths import (BatchProbs, Lazy, _readonly, batch_entropy,
                                   batch_probabilities, probabilities)

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration


_new = object.__new__


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
    # (None when the bundle has no uncertainty.bin, the configuration is of the
    # all scope, or load(uncertainty=False))
    # out-of-distribution score of the answering slice's features: minus the cosine
    # similarity to the nearest class prototype of the training features (higher = less like
    # the training data), computed in the interpreter (edge_sdk.answers.ood_graph)
    ood_score: float | None = None
    # ood_score at or below the threshold that accepts 95 % of in-distribution validation
    # images; False also makes ``abstain`` true (load(abstain_on_ood=False) turns that off)
    in_distribution: bool | None = None
    # split-conformal set at the model's alpha: class indices that hold the true class with
    # probability >= 1 - alpha (marginally, over calls), calibrated on validation
    prediction_set: tuple[int, ...] | None = None
    # the sample's raw statistics (per channel: mean and maximum) fall outside
    # what the training split's samples span, widened by the manifest's stated margin: e.g.
    # an image scaled to [0, 1] for a bundle trained on [0, 16]. True also makes ``abstain``
    # true (with abstain_on_ood). None: the bundle carries no input statistics (schema < 6)
    # or load(input_check=False)
    input_suspect: bool | None = None

    if not TYPE_CHECKING:  # (mypy keeps flagging misspelt attributes)
        def __getattr__(self, name: str) -> Any:
            # an answer made by lean_answer() computes ``probs``, ``entropy``,
            # ``mutual_info`` (those it was not given) and ``prediction_set`` when one is first
            # read: 1-10 us of a call that reads only label and confidence; every field is
            # then a plain attribute, as for any other prediction
            d = self.__dict__
            lazy = d.get("_lazy")
            if lazy is None or name not in _LAZY:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            fn, args = lazy
            d.update(fn(*args))
            del d["_lazy"]
            return d[name]

    def __getstate__(self) -> dict[str, Any]:
        # pickled and copied with every field made (the lazy ones' arguments hold the
        # interpreter's arrays and the bundle's statistics, which are not the answer's)
        if "_lazy" in self.__dict__:
            getattr(self, "entropy")  # (no class default: __getattr__ makes every lazy field)
        return self.__dict__

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
# the set is made when first read (lean_answer): a class attribute holding the field's default
# would be found before __getattr__ is asked, so it goes (__init__ keeps its default)
delattr(Prediction, "prediction_set")
_LAZY = frozenset({"probs", "entropy", "mutual_info", "prediction_set"})


def lean_answer(c: Configuration, labels: Sequence[str], label: int, confidence: float,
                lazy: Lazy, abstain: bool,
                latency_ms: float, invoke_ms: float, met: bool, input_suspect: bool | None,
                probs: np.ndarray | None = None, ood_score: float | None = None,
                in_distribution: bool | None = None, lazy_set: bool = False) -> Prediction:
    """:func:`answer` of a one-sample call, the fields ``lazy`` computes (``(function,
    arguments)``) made when first read (``Prediction.__getattr__``): a point's probs, entropy
    and mutual information (0), a head's entropy and mutual information, its probs unless
    given, and (``lazy_set``: ``lazy`` is :func:`with_set`'s) the prediction set."""
    p = _new(Prediction)
    d = p.__dict__
    d.update(label=label, class_name=labels[label], _lazy=lazy, confidence=confidence,
             abstain=abstain, width=c.width, scope=c.scope, samples=c.samples,
             config_id=c.id, latency_ms=latency_ms, budget_met=met, invoke_ms=invoke_ms,
             batch_size=1, ood_score=ood_score, in_distribution=in_distribution,
             input_suspect=input_suspect)
    if not lazy_set:
        d["prediction_set"] = None
    if probs is not None:
        d["probs"] = probs
    return p


def with_set(inner: Lazy, make_set: Callable[..., tuple[int, ...] | None], key: str,
             alpha: float | None, label: int, probs: np.ndarray | None) -> dict[str, Any]:
    """The lazy fields of ``inner`` and the conformal set ``make_set(key, alpha, probs,
    label)`` (holding ``label``, the non-empty rule), made from the same probabilities
    (``probs`` when they were given) when any of them is first read: a call that reads only
    label, confidence and the OOD verdict never builds it, nor looks up its quantile."""
    fn, args = inner
    out = fn(*args)
    p = out["probs"] if probs is None else probs
    out["prediction_set"] = make_set(key, alpha, p.tolist(), label)
    return out


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
    data: out of distribution by the OOD score, or its raw statistics are suspect
    (so the two never contradict each other: either one makes the call abstain)."""
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
    # built without the frozen dataclass' __init__ (20 object.__setattr__ calls,
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


class BatchPrediction(BatchCall, Sequence[Prediction]):
    """What ``predict_batch`` answers: the batch as read-only numpy arrays, as LiteRT and
    torch-uncertainty hand them back — ``labels [N]``, ``confidence [N]``, ``probs [N, C]``
    (float64), ``abstain [N]``, ``entropy [N]``, ``mutual_info [N]``, ``config_ids [N]``
    (who answered each sample), and (None without the statistics they need) ``ood_score
    [N]``, ``in_distribution [N]``, ``prediction_sets [N, C]`` (boolean mask) and
    ``input_suspect [N]`` — the call's own ``latency_ms`` (the whole ``predict_batch``
    call), ``invoke_ms`` and ``budget_met``, its ``config_id``, and a sequence of
    :class:`Prediction` (indexing, iterating and ``len`` work as on the list it used to be;
    a slice is a BatchPrediction of those samples). The per-sample :class:`Prediction`
    objects are made on first use (making 64 of them cost more than a small batched invoke).

    ``config_id`` is one id for the batch: the configuration that answered every sample,
    or, where a cascade's stages shared the batch, the last stage that ran (its final
    configuration, which answered the samples the earlier stages were unsure of);
    ``config_ids`` says which answered each sample. ``stage_ids``: the call's plan, its
    configurations in stage order (one for the ``best`` policy). The call's half lives in
    :class:`edge_sdk.answers.batch_call.BatchCall`."""

    def __init__(self, preds: list[Prediction], classes: int,
                 stage_ids: Sequence[str] = ()):
        """From per-sample predictions (a cascade's batch, whose samples differ in who
        answered; ``stage_ids``: the plan's configurations in stage order, which
        ``config_id`` needs when more than one answered)."""
        self._preds: list[Prediction] | None = list(preds)
        self._make: Callable[[int], Prediction] | None = None
        ps = self._preds
        n = self._n = len(ps)
        # the call's figures, which every prediction of it carries
        if ps:
            self._call(ps[0].latency_ms, ps[0].invoke_ms, ps[0].budget_met, tuple(stage_ids),
                       None)
        else:
            self._call(0.0, 0.0, True, tuple(stage_ids), None)
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
        self._call(latency_ms, invoke_ms, met, (c.id,), c.id)
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
        if entropy is None or mi is None:
            if self._src is not None:  # a slice: the batch's, computed once for all of it
                whole, s = self._src
                entropy, mi = (a[s] for a in whole._entropies())
            else:  # of_one's batch: from its BatchProbs
                bp = self._bp
                assert bp is not None  # (set by of_one, the only other place these are None)
                entropy, mi = map(_readonly, batch_entropy(bp))
            self._entropy, self._mi = entropy, mi
        return entropy, mi

    def _list(self) -> list[Prediction]:
        return super()._list()

    @overload
    def __getitem__(self, i: int) -> Prediction: ...
    @overload
    def __getitem__(self, i: slice) -> BatchPrediction: ...
    def __getitem__(self, i: int | slice) -> Prediction | BatchPrediction:
        if isinstance(i, slice):  # a batch of those samples, as numpy slices an array
            out: BatchPrediction = self._slice(i)
            return out
        p: Prediction = self._list()[i]
        return p

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
        return (f"BatchPrediction(n={self._n}, config_id={self.config_id!r}, "
                f"labels={self.labels.tolist()!r})")

