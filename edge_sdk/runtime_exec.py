"""Executing a plan: the stages the policy chose, on this thread's interpreters, timed end to
end. A mixin of :class:`edge_sdk.runtime.EdgeModel` (which provides ``_resident``, ``policy``,
``_clock``, ``_lock``, ``_labels``, ``_target_key``, ``_classes``, ``_batchable``).

What is measured: ``latency_ms`` is the wall time from the call's entry to its answer (what
the app waits); the policy learns it per configuration, minus the time spent building or
resizing interpreters in that call (a one-off, reported as first-use cost), so a cold call
never pushes a configuration out of its budget.
"""
from __future__ import annotations

import numpy as np

from edge_sdk.errors import AllocationError, EdgeSdkError
from edge_sdk.policy import Budget, Stage
from edge_sdk.prediction import Draft, Prediction, draft, draft_batch, finish

_RESIZE_ERRORS = (RuntimeError, ValueError)  # what LiteRT raises for a batch it cannot take


class Executor:
    def _invoke(self, interps: list, x: np.ndarray) -> tuple[np.ndarray, float]:
        """Logits ``[rows, C]`` of batch-1 input ``x`` and the interpreter's wall time (ms)."""
        classes = self._classes
        t0 = self._clock()
        if len(interps) == 1:  # point and head: one invoke
            it, inp, out = interps[0]
            it.set_tensor(inp, x)
            it.invoke()
            logits = it.get_tensor(out).reshape(-1, classes)
        else:
            rows = []
            for it, inp, out in interps:
                it.set_tensor(inp, x)
                it.invoke()
                rows.append(it.get_tensor(out).reshape(-1, classes))
            logits = np.concatenate(rows, 0)
        return logits, (self._clock() - t0) * 1000

    def _met(self, configs, budget: Budget, latency_ms: float) -> bool:
        if budget.latency_ms is not None and latency_ms > budget.latency_ms:
            return False
        return all(self.policy.fits_memory(c, budget) for c in configs)

    def _learn(self, times: list, total: float, built: float, n: int = 1) -> None:
        """Observe each stage's end-to-end share: its own time plus the call's fixed part
        (input checks, planning), without building/resizing time."""
        fixed = max(total - built - sum(t for _, t in times), 0.0)
        with self._lock:
            for c, t in times:
                self.policy.observe(c.id, t + fixed, n)

    def _execute_one(self, xn: np.ndarray, stages: tuple[Stage, ...], budget: Budget,
                     t0: float) -> Prediction:
        clock = self._clock
        if len(stages) == 1:  # the common case, kept lean: this is all SDK time
            c = stages[0].config
            interps, built = self._resident(c, 1)
            logits, invoke = self._invoke(interps, xn)
            d = draft(c, logits)
            total = (clock() - t0) * 1000
            with self._lock:
                self.policy.observe(c.id, total - built)
            met = (budget.latency_ms is None or total <= budget.latency_ms) and \
                self.policy.fits_memory(c, budget)
            return finish(d, self._labels, self._target_key, total, invoke, met)
        built = invoke = 0.0
        times = []
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
                break  # no room for the next stage: this stage's answer stands
        total = (clock() - t0) * 1000
        self._learn(times, total, built)
        met = self._met([c for c, _ in times], budget, total)
        return finish(d, self._labels, self._target_key, total, invoke, met)

    def _run_batch(self, c, xb: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(logits ``[n, rows, C]``, invoke ms, build/resize ms) of ``n`` normalised samples:
        one invoke per interpreter with the input resized to ``[n, ...]`` when the manifest
        says the batch dimension is resizable (its output is ``[n * rows, C]``, sample-major),
        else one invoke per sample."""
        n = len(xb)
        # version-1 bundles hard-code batch 1 in their graphs (XNNPACK refuses the resize)
        if n > 1 and self.manifest.batch_resizable and self._batchable.get(c.id, True):
            try:
                interps, built = self._resident(c, n)
            except AllocationError:  # the interpreter refused this batch size: loop instead
                self._batchable[c.id] = False
                for f in c.files:
                    self._local.cache.pop(f.name, None)
            except EdgeSdkError:
                raise  # a slice refused (e.g. materialised bytes off the manifest): not a resize
            except _RESIZE_ERRORS:
                self._batchable[c.id] = False  # remember: this slice loops
                for f in c.files:  # a failed resize leaves them unusable
                    self._local.cache.pop(f.name, None)
            else:
                t0 = self._clock()
                outs = []
                for it, inp, out in interps:
                    it.set_tensor(inp, xb)
                    it.invoke()
                    outs.append(it.get_tensor(out).reshape(n, -1, self._classes))
                ms = (self._clock() - t0) * 1000
                return (outs[0] if len(outs) == 1 else np.concatenate(outs, 1)), ms, built
        interps, built = self._resident(c, 1)
        rows, ms = [], 0.0
        for i in range(n):
            logits, m = self._invoke(interps, xb[i:i + 1])
            rows.append(logits)
            ms += m
        return np.stack(rows), ms, built

    def _execute_batch(self, xn: np.ndarray, stages: tuple[Stage, ...], budget: Budget,
                       t0: float) -> list[Prediction]:
        """One plan for the whole batch: each stage runs on the samples still pending (a
        cascade's second stage only on those the first was not confident about)."""
        clock = self._clock
        n = len(xn)
        drafts: list[Draft | None] = [None] * n
        pending = np.arange(n)
        built = invoke = 0.0
        times = []
        for i, st in enumerate(stages):
            s0 = clock()
            logits, ms, b = self._run_batch(st.config, xn[pending])
            ds = draft_batch(st.config, logits)
            s1 = clock()
            times.append((st.config, (s1 - s0) * 1000 - b))
            built += b
            invoke += ms
            last = st.accept is None or (budget.latency_ms is not None and (
                (s1 - t0) * 1000 - built + stages[i + 1].predicted_ms > budget.latency_ms))
            rest = []
            for j, d in zip(pending, ds):
                if last or d.confidence >= st.accept:
                    drafts[j] = d
                else:
                    rest.append(j)
            if not rest:
                break
            pending = np.asarray(rest)
        total = (clock() - t0) * 1000
        if len(times) == 1:  # a stage on a subset is not a batch of n: learn plain calls only
            self._learn(times, total, built, n)
        met = self._met([c for c, _ in times], budget, total)
        return [finish(d, self._labels, self._target_key, total, invoke, met, n) for d in drafts]
