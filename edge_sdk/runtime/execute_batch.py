"""Executing a plan on a batch: one invoke per interpreter with the input resized to the batch
where the slice allows it (else one per sample), the answers as arrays, and a cascade's later
stages only on the samples the earlier ones were not confident about. Extends
:class:`edge_sdk.runtime.execute.Executor` (the one-sample path, whose invoke, features and
budget bookkeeping it reuses).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.maths import _non_finite, batch_answer, batch_probabilities
from edge_sdk.answers.prediction import BatchPrediction, Draft, draft_batch, finish
from edge_sdk.errors import AllocationError, EdgeSdkError
from edge_sdk.runtime.execute import Executor, Logits

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.policy.budget import Budget
    from edge_sdk.policy.plan import Stage

_RESIZE_ERRORS = (RuntimeError, ValueError)  # what LiteRT raises for a batch it cannot take


class BatchExecutor(Executor):
    def _uncertain_batch(self, ds: list[Draft[np.ndarray]],
                         scores: npt.NDArray[np.float64] | None,
                         keys: list[str], alpha: float | None) -> None:
        """:meth:`_uncertain` for a stage's drafts; ``scores``: their OOD scores [n] (None
        for a configuration without one)."""
        c = ds[0].config
        unc = self._unc
        if unc is None:  # called only with the bundle's statistics
            return
        wk = self._unc_width.get(c.id)
        if wk is not None and scores is not None:
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
            mask = unc.set_mask(np.asarray([ds[i].probs for i in idx]), q, self.conformal,
                                [ds[i].label for i in idx])  # each set holds its answer
            for i, row in zip(idx, mask):
                ds[i].prediction_set = tuple(np.flatnonzero(row).tolist())

    # ---- execution -------------------------------------------------------------------------
    def _run_batch(self, c: Configuration, xb: npt.NDArray[Any], answer_only: bool = False
                   ) -> tuple[Logits | None, float, float, npt.NDArray[np.float64] | None,
                              npt.NDArray[np.float32] | None]:
        """(logits ``[n, rows, C]``, invoke ms, build/resize ms, OOD scores ``[n]`` or None,
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
                # a point's logits are read only to name a non-finite one (a
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
                        np.concatenate(outs, 1)), ms, built, self._scores(c, interps, n), \
                    interps[0][0].get_tensor(ans) if ans >= 0 else None
        interps, built = self._resident(c, 1)
        rows: list[Logits] = []
        scores: list[npt.NDArray[np.float64] | None] = []
        answers: list[npt.NDArray[np.float32]] = []
        it, _, _, ans = interps[0]
        ans = ans if len(interps) == 1 else -1
        ms = 0.0
        for i in range(n):
            logits, m = self._invoke(interps, xb[i:i + 1])
            rows.append(logits)
            scores.append(self._scores(c, interps, 1))
            if ans >= 0:
                answers.append(it.get_tensor(ans))
            ms += m
        return np.stack(rows), ms, built, \
            None if scores[0] is None else \
            np.concatenate(cast("list[npt.NDArray[np.float64]]", scores)), \
            np.concatenate(answers) if answers else None  # all or none have

    def _execute_batch(self, xn: npt.NDArray[Any], stages: tuple[Stage, ...], budget: Budget,
                       t0: float, alpha: float | None = None,
                       suspect: np.ndarray | None = None) -> BatchPrediction:
        """One plan for the whole batch: each stage runs on the samples still pending (a
        cascade's second stage only on those the first was not confident about)."""
        clock = self._clock
        n = len(xn)
        if len(stages) == 1:  # one configuration answers all: arrays only
            c = stages[0].config
            logits, invoke, built, ood, answers = self._run_batch(
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
            ind = sets = None
            if self._unc is not None:
                wk = self._unc_width.get(c.id)
                if wk is not None and ood is not None:
                    ind = ood <= self._unc.widths[wk].threshold
                q = self._qhat(c.id, alpha)
                if q is not None:
                    # every set holds its answer's label (the non-empty rule)
                    sets = self._unc.set_mask(bp.probs, q, self.conformal, bp.labels)
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
            logits, ms, b, scores, _ = self._run_batch(st.config, xn[pending])
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
                                      None if scores is None else scores[[k for k, _ in done]],
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
