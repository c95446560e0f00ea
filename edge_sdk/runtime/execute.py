"""Executing a plan: the stages the policy chose, on this thread's interpreters, timed end to
end. A mixin of :class:`edge_sdk.runtime.model.EdgeModel` (which provides ``policy``, ``_clock``,
``_lock``, ``_labels``, ``_target_key``, ``_classes``, ``_batchable``) beside
:class:`edge_sdk.runtime.residency.Residency` (``_resident``: this thread's interpreters).

What is measured: ``latency_ms`` is the wall time from the call's entry to its answer (what
the app waits); the policy learns it per configuration, minus the time spent building or
resizing interpreters in that call (a one-off, reported as first-use cost), so a cold call
never pushes a configuration out of its budget.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.graph import ANSWER
from edge_sdk.errors import AllocationError, BundleError, EdgeSdkError
from edge_sdk.policy.budget import Budget
from edge_sdk.policy.policy import Stage
from edge_sdk.bundle import Configuration
from edge_sdk.answers.maths import (
    Lazy,
    _non_finite,
    answer_top,
    batch_answer,
    batch_probabilities,
    eager_fields,
    lean_top,
    probabilities,
)
from edge_sdk.answers.prediction import (
    BatchPrediction,
    Draft,
    Prediction,
    answer,
    draft,
    draft_batch,
    finish,
    lean_answer,
)
from edge_sdk.runtime.residency import Interp, PerThread
from edge_sdk.answers.uncertainty import cascade_key

if TYPE_CHECKING:
    from edge_sdk.bundle import Manifest
    from edge_sdk.policy.policy import Policy
    from edge_sdk.answers.uncertainty import Uncertainty

Logits = npt.NDArray[np.float32]

_RESIZE_ERRORS = (RuntimeError, ValueError)  # what LiteRT raises for a batch it cannot take


class Executor:
    # What EdgeModel sets (declared for the checker; no class attributes at run time).
    manifest: Manifest
    policy: Policy
    alpha: float
    conformal: str
    abstain_on_ood: bool
    _unc: Uncertainty | None
    _unc_width: dict[str, str]
    _feat: dict[str, int]
    _qhats: dict[tuple[str, float], float | None]
    _classes: int
    _labels: tuple[str, ...]
    _target_key: str
    _clock: Callable[[], float]
    _local: PerThread
    _lock: threading.Lock
    _batchable: dict[str, bool]

    if TYPE_CHECKING:
        def _resident(self, c: Configuration, n: int = 1) -> tuple[list[Interp], float]: ...

    # ---- uncertainty (issue 33) ------------------------------------------------------------
    def _feature_index(self, c: Configuration, it: Any) -> int:
        """The tensor index of ``c``'s features output (its slice's second output), looked up
        once and checked against the statistics' dimension."""
        fi = self._feat.get(c.id)
        if fi is None:
            # the slice's own outputs: the answer graph appends one (edge_sdk.answers.graph)
            outs = [o for o in it.get_output_details() if o["name"] != ANSWER]
            assert self._unc is not None  # only asked for with the bundle's OOD statistics
            dim = self._unc.widths[self._unc_width[c.id]].dim
            if len(outs) < 2 or int(outs[1]["shape"][-1]) != dim:
                got = "no second output" if len(outs) < 2 else \
                    f"features of shape {list(outs[1]['shape'])}"
                raise BundleError(f"configuration {c.id!r}: its slice has {got}, the bundle's "
                                  f"OOD statistics need [1, {dim}] features (re-export)")
            fi = self._feat[c.id] = int(outs[1]["index"])
        return fi

    def _qhat(self, key: str, alpha: float | None) -> float | None:
        a = self.alpha if alpha is None else alpha
        q = self._qhats.get((key, a), False)
        if q is False:
            q = self._qhats[(key, a)] = self._unc.qhat(key, self.conformal, a)
        return q

    def _uncertain(self, c: Configuration, probs: list[float], interps: list[Interp],
                   key: str, alpha: float | None, probe: bool = False
                   ) -> tuple[float | None, bool | None, tuple[int, ...] | None]:
        """(OOD score of the answering slice's features, in distribution, conformal set at
        the quantile of ``key``: the configuration, or the cascade plan that answered).
        ``probe``: zero features, to measure the cost (load time)."""
        score: float | None = None
        ind: bool | None = None
        pset: tuple[int, ...] | None = None
        unc = self._unc
        if unc is None:  # callers ask only with the bundle's statistics
            return score, ind, pset
        wk = self._unc_width.get(c.id)
        if wk is not None:
            f: npt.NDArray[np.float32]
            if probe:
                f = np.zeros(unc.widths[wk].dim, np.float32)
            else:
                it = interps[0][0]
                f = it.get_tensor(self._feature_index(c, it))
            score = unc.score_one(wk, f)
            ind = score <= unc.widths[wk].threshold
        q = self._qhat(key, alpha)
        if q is not None:
            pset = unc.set_one(probs, q, self.conformal)
        return score, ind, pset

    def _uncertain_batch(self, ds: list[Draft[np.ndarray]], interps_feats: npt.NDArray[np.float32] | None,
                         keys: list[str], alpha: float | None) -> None:
        """:meth:`_uncertain` for a stage's drafts; ``interps_feats``: their features [n, D]
        (None for a configuration without a score)."""
        c = ds[0].config
        unc = self._unc
        if unc is None:  # called only with the bundle's statistics
            return
        wk = self._unc_width.get(c.id)
        if wk is not None and interps_feats is not None:
            scores = unc.score(wk, interps_feats)
            thr = unc.widths[wk].threshold
            for d, s in zip(ds, scores.tolist()):
                d.ood_score, d.in_distribution = s, s <= thr
        by_key: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            by_key.setdefault(k, []).append(i)
        for k, idx in by_key.items():
            q = self._qhat(k, alpha)
            if q is None:
                continue
            mask = unc.set_mask(np.asarray([ds[i].probs for i in idx]), q, self.conformal)
            for i, row in zip(idx, mask):
                ds[i].prediction_set = tuple(np.flatnonzero(row).tolist())

    # ---- execution -------------------------------------------------------------------------
    def _invoke(self, interps: list[Interp], x: npt.NDArray[Any]
                ) -> tuple[Logits, float]:
        """Logits ``[rows, C]`` of batch-1 input ``x`` and the interpreter's wall time (ms)."""
        classes = self._classes
        t0 = self._clock()
        logits: Logits
        if len(interps) == 1:  # point and head: one invoke
            it, inp, out, _ = interps[0]
            it.set_tensor(inp, x)
            it.invoke()
            logits = it.get_tensor(out).reshape(-1, classes)
        else:
            rows: list[Logits] = []
            for it, inp, out, _ in interps:
                it.set_tensor(inp, x)
                it.invoke()
                rows.append(it.get_tensor(out).reshape(-1, classes))
            logits = np.concatenate(rows, 0)
        return logits, (self._clock() - t0) * 1000

    def _met(self, configs: list[Configuration], budget: Budget, latency_ms: float) -> bool:
        if budget.latency_ms is not None and latency_ms > budget.latency_ms:
            return False
        return all(self.policy.fits_memory(c, budget) for c in configs)

    def _learn(self, times: list[tuple[Configuration, float]], total: float, built: float, n: int = 1) -> None:
        """Observe each stage's end-to-end share: its own time plus the call's fixed part
        (input checks, planning), without building/resizing time."""
        fixed = max(total - built - sum(t for _, t in times), 0.0)
        with self._lock:
            for c, t in times:
                self.policy.observe(c.id, t + fixed, n)

    def _execute_one(self, xn: npt.NDArray[Any], stages: tuple[Stage, ...], budget: Budget,
                     t0: float, alpha: float | None = None, suspect: bool | None = None
                     ) -> Prediction:
        clock = self._clock
        if len(stages) == 1:  # the common case, kept lean: this is all SDK time (issue 34)
            c = stages[0].config
            ready = self._local.ready.get(c.id)  # resident at batch 1 (PerThread)
            if ready is None:
                interps, built = self._resident(c, 1)
            else:
                interps, built = ready, 0.0
            top: tuple[np.ndarray | None, int, float, Lazy] | None
            if len(interps) == 1:  # point and head: one invoke, inline
                it, inp, out, ans = interps[0]
                i0 = clock()
                it.set_tensor(inp, xn)
                it.invoke()
                if ans >= 0:  # the softmax ran in the graph (edge_sdk.answers.graph)
                    p = it.get_tensor(ans)
                    logits = it.get_tensor(out) if c.scope == "head" else None
                    invoke = (clock() - i0) * 1000
                    top = answer_top(c, p, logits)
                    if top is None:  # the graph's guard: a logit was not finite
                        _non_finite(c, it.get_tensor(out))
                else:
                    logits = it.get_tensor(out).reshape(-1, self._classes)
                    invoke = (clock() - i0) * 1000
                    top = lean_top(c, logits)
            else:
                logits, invoke = self._invoke(interps, xn)
                top = lean_top(c, logits)
            ood = ind = pset = None
            # without OOD statistics the fields nobody may read wait until read (issue 34):
            # a point's probs and entropy, a head's entropy and mutual information
            lean = top if self._unc is None else None
            if lean is not None:
                lean_probs, label, conf, lazy = lean
            else:
                if top is None:  # a head's row underflowed (its logits were read)
                    assert logits is not None
                    probs, entropy, mi, label, conf = probabilities(c, logits)
                else:
                    probs, entropy, mi, label, conf = eager_fields(top)
                if self._unc is not None:
                    ood, ind, pset = self._uncertain(c, probs, interps, c.id, alpha)
            threshold = c.thresholds[self._target_key]
            abstain = threshold is None or conf < threshold or (self.abstain_on_ood and (
                ind is False or suspect is True))  # prediction.abstains(), inline
            total = (clock() - t0) * 1000
            policy = self.policy
            with self._lock:
                policy.observe(c.id, total - built)
            met = (budget.latency_ms is None or total <= budget.latency_ms) and \
                policy.fits_memory(c, budget)
            if lean is not None:
                return lean_answer(c, self._labels, label, conf, lazy, abstain, total, invoke,
                                   met, suspect, lean_probs)
            return answer(c, self._labels, probs, entropy, mi, label, conf, abstain, total,
                          invoke, met, 1, ood, ind, pset, suspect)
        built = invoke = 0.0
        times: list[tuple[Configuration, float]] = []
        cut = False
        for i, st in enumerate(stages):
            s0 = clock()
            interps, b = self._resident(st.config, 1)
            logits, ms = self._invoke(interps, xn)
            d = draft(st.config, logits)
            s1 = clock()
            times.append((st.config, (s1 - s0) * 1000 - b))
            built += b
            invoke += ms
            if st.accept is None or d.confidence >= st.accept:
                break
            if budget.latency_ms is not None and \
                    (s1 - t0) * 1000 - built + stages[i + 1].predicted_ms > budget.latency_ms:
                cut = True
                break  # no room for the next stage: this stage's answer stands
        if self._unc is not None:
            d.ood_score, d.in_distribution, d.prediction_set = self._uncertain(
                d.config, d.probs, interps, self._set_key(stages, d.config, cut), alpha)
        d.input_suspect = suspect
        total = (clock() - t0) * 1000
        self._learn(times, total, built)
        met = self._met([c for c, _ in times], budget, total)
        return finish(d, self._labels, self._target_key, total, invoke, met,
                      abstain_on_ood=self.abstain_on_ood)

    def _set_key(self, stages: tuple[Stage, ...], answered: Configuration, cut: bool) -> str:
        """Whose conformal quantile a staged answer uses. A two-stage plan that ran as
        planned (the first stage confident, or the second answering) mixes two
        configurations by the input's confidence: its own quantile, calibrated on that very
        mixture, keeps coverage >= 1 - alpha. A plan cut short by the budget (the time left,
        not the input, decided) and the width climb of bundles without plans: the answering
        configuration's own quantile."""
        unc = self._unc
        if len(stages) == 2 and not cut and unc is not None:  # unc: asked only with statistics
            key = cascade_key(stages[0].config.id, stages[1].config.id)
            if key in unc.quantiles:
                return key
        return answered.id

    def _features(self, c: Configuration, interps: list[Interp], n: int
                  ) -> npt.NDArray[np.float32] | None:
        """``c``'s features ``[n, D]`` after an invoke (None: no OOD score for ``c``)."""
        if self._unc is None or c.id not in self._unc_width:
            return None
        it = interps[0][0]
        f: npt.NDArray[np.float32] = it.get_tensor(self._feature_index(c, it)).reshape(n, -1).copy()
        return f

    def _run_batch(self, c: Configuration, xb: npt.NDArray[Any], answer_only: bool = False
                   ) -> tuple[Logits | None, float, float, npt.NDArray[np.float32] | None,
                              npt.NDArray[np.float32] | None]:
        """(logits ``[n, rows, C]``, invoke ms, build/resize ms, features ``[n, D]`` or None,
        the graph's answers ``[n, C]`` or None: edge_sdk.answers.graph) of ``n`` checked raw
        samples (``InputChecker.feed_batch``):
        one invoke per interpreter with the input resized to ``[n, ...]`` when the manifest
        says the batch dimension is resizable (its output is ``[n * rows, C]``, sample-major),
        else one invoke per sample. ``answer_only``: the logits are not read (None) when the
        graph computed the answers in one batched invoke (a point needs nothing else)."""
        n = len(xb)
        # version-1 bundles hard-code batch 1 in their graphs (XNNPACK refuses the resize)
        if n > 1 and self.manifest.batch_resizable and self._batchable.get(c.id, True):
            try:
                interps, built = self._resident(c, n)
            except AllocationError:  # the interpreter refused this batch size: loop instead
                self._batchable[c.id] = False
                for f in c.files:
                    self._local.cache.pop(f.name, None)
                self._local.ready.clear()
            except EdgeSdkError:
                raise  # a slice refused (e.g. materialised bytes off the manifest): not a resize
            except _RESIZE_ERRORS:
                self._batchable[c.id] = False  # remember: this slice loops
                for f in c.files:  # a failed resize leaves them unusable
                    self._local.cache.pop(f.name, None)
                self._local.ready.clear()
            else:
                ans = interps[0][3] if len(interps) == 1 else -1  # the graph's answers
                # a point's logits are read only to name a non-finite one (issue 34: a
                # get_tensor costs ~4 us right after a batched invoke)
                read = not (answer_only and ans >= 0)
                t0 = self._clock()
                outs: list[Logits] = []
                for it, inp, out, _ in interps:
                    it.set_tensor(inp, xb)
                    it.invoke()
                    if read:
                        outs.append(it.get_tensor(out).reshape(n, -1, self._classes))
                ms = (self._clock() - t0) * 1000
                return (None if not outs else outs[0] if len(outs) == 1 else
                        np.concatenate(outs, 1)), ms, built, self._features(c, interps, n), \
                    interps[0][0].get_tensor(ans) if ans >= 0 else None
        interps, built = self._resident(c, 1)
        rows: list[Logits] = []
        feats: list[npt.NDArray[np.float32] | None] = []
        answers: list[npt.NDArray[np.float32]] = []
        it, _, _, ans = interps[0]
        ans = ans if len(interps) == 1 else -1
        ms = 0.0
        for i in range(n):
            logits, m = self._invoke(interps, xb[i:i + 1])
            rows.append(logits)
            feats.append(self._features(c, interps, 1))
            if ans >= 0:
                answers.append(it.get_tensor(ans))
            ms += m
        return np.stack(rows), ms, built, \
            None if feats[0] is None else \
            np.concatenate(cast("list[npt.NDArray[np.float32]]", feats)), \
            np.concatenate(answers) if answers else None  # all or none have

    def _execute_batch(self, xn: npt.NDArray[Any], stages: tuple[Stage, ...], budget: Budget,
                       t0: float, alpha: float | None = None,
                       suspect: np.ndarray | None = None) -> BatchPrediction:
        """One plan for the whole batch: each stage runs on the samples still pending (a
        cascade's second stage only on those the first was not confident about)."""
        clock = self._clock
        n = len(xn)
        if len(stages) == 1:  # one configuration answers all: arrays only (issue 34)
            c = stages[0].config
            logits, invoke, built, feats, answers = self._run_batch(
                c, xn, answer_only=c.scope == "point")
            if answers is None:
                assert logits is not None
                bp = batch_probabilities(c, logits)
            else:
                got = batch_answer(c, answers, logits)
                if got is None:  # the graph's guard: a logit was not finite
                    if logits is None:  # not read: the interpreter still holds them
                        it, _, out, _ = self._resident(c, n)[0][0]
                        logits = it.get_tensor(out)
                    _non_finite(c, logits)
                bp = got
            ood = ind = sets = None
            if self._unc is not None:
                wk = self._unc_width.get(c.id)
                if wk is not None and feats is not None:
                    ood = self._unc.score(wk, feats)
                    ind = ood <= self._unc.widths[wk].threshold
                q = self._qhat(c.id, alpha)
                if q is not None:
                    sets = self._unc.set_mask(bp.probs, q, self.conformal)
            threshold = c.thresholds[self._target_key]  # prediction.abstains(), on arrays
            abstain = np.ones(n, bool) if threshold is None else bp.confidence < threshold
            if self.abstain_on_ood:
                if ind is not None:
                    abstain |= ~ind
                if suspect is not None:
                    abstain |= suspect
            total = (clock() - t0) * 1000
            with self._lock:
                self.policy.observe(c.id, total - built, n)
            met = self._met([c], budget, total)
            return BatchPrediction.of_one(c, self._labels, bp, abstain, total, invoke, met,
                                          ood, ind, sets, suspect)
        drafts: list[Draft[np.ndarray] | None] = [None] * n
        pending = np.arange(n)
        built = invoke = 0.0
        times: list[tuple[Configuration, float]] = []
        for i, st in enumerate(stages):
            s0 = clock()
            logits, ms, b, feats, _ = self._run_batch(st.config, xn[pending])
            assert logits is not None  # (read unless answer_only)
            ds = draft_batch(st.config, logits)
            s1 = clock()
            times.append((st.config, (s1 - s0) * 1000 - b))
            built += b
            invoke += ms
            last = st.accept is None or (budget.latency_ms is not None and (
                (s1 - t0) * 1000 - built + stages[i + 1].predicted_ms > budget.latency_ms))
            rest: list[np.intp] = []
            done: list[tuple[int, str]] = []  # (index in ds, the conformal quantile's key)
            acc = st.accept
            for k, (j, d) in enumerate(zip(pending, ds)):
                if last or acc is None or d.confidence >= acc:
                    drafts[j] = d
                    if suspect is not None:
                        d.input_suspect = bool(suspect[j])
                    cut = st.accept is not None and d.confidence < st.accept
                    done.append((k, self._set_key(stages, d.config, cut)
                                 if self._unc is not None else ""))
                else:
                    rest.append(j)
            if self._unc is not None and done:
                self._uncertain_batch([ds[k] for k, _ in done],
                                      None if feats is None else feats[[k for k, _ in done]],
                                      [key for _, key in done], alpha)
            if not rest:
                break
            pending = np.asarray(rest)
        total = (clock() - t0) * 1000
        if len(times) == 1:  # a stage on a subset is not a batch of n: learn plain calls only
            self._learn(times, total, built, n)
        met = self._met([c for c, _ in times], budget, total)
        return BatchPrediction([finish(d, self._labels, self._target_key, total, invoke, met,
                                       n, self.abstain_on_ood) for d in drafts if d is not None],
                               self._classes)  # (every sample has its draft by the last stage)
