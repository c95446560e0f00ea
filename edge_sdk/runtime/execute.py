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

import math
import numbers
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.graph import ANSWER
from edge_sdk.answers.ood_graph import OOD
from edge_sdk.bundle.records import width_key
from edge_sdk.backends import BackendError
from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.answers.maths import (
    Lazy,
    _non_finite,
    answer_top,
    lean_top,
    probabilities,
)
from edge_sdk.answers.prediction import (
    Prediction,
    answer,
    draft,
    finish,
    lean_answer,
    with_set,
)
from edge_sdk.answers.uncertainty import cascade_key
from edge_sdk.policy.plan import Stage

if TYPE_CHECKING:
    from edge_sdk.policy.budget import Budget
    from edge_sdk.runtime.residency import Interp, PerThread
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.inputs.checks import InputChecker
    from edge_sdk.inputs.stats import SuspectCheck
    from edge_sdk.bundle.manifest import Manifest
    from edge_sdk.policy.policy import Policy
    from edge_sdk.answers.uncertainty import Uncertainty

Logits = npt.NDArray[np.float32]


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
    _inputs: InputChecker
    _suspect: SuspectCheck | None
    _answerable: dict[str, Configuration]
    _configs: dict[str, Configuration]
    _pinned_plans: dict[str, tuple[Stage]]
    _ood_at: dict[str, tuple[int, float]]
    left_out: dict[str, str]
    _widths: dict[float, Configuration]  # a width asked for -> a point configuration of it
    backend: str
    strict: bool

    if TYPE_CHECKING:
        def _resident(self, c: Configuration, n: int = 1) -> tuple[list[Interp], float]: ...

    # ---- uncertainty ------------------------------------------------------------
    def _feature_index(self, c: Configuration, it: Any) -> int:
        """The tensor index of ``c``'s features output (its slice's second output), looked up
        once and checked against the statistics' dimension."""
        fi = self._feat.get(c.id)
        if fi is None:
            # the slice's own outputs: the answer graph appends one (edge_sdk.answers.graph)
            outs = [o for o in it.get_output_details() if o["name"] not in (ANSWER, OOD)]
            assert self._unc is not None  # only asked for with the bundle's OOD statistics
            dim = self._unc.widths[self._unc_width[c.id]].dim
            if len(outs) < 2 or int(outs[1]["shape"][-1]) != dim:
                got = "no second output" if len(outs) < 2 else \
                    f"features of shape {list(outs[1]['shape'])}"
                raise BundleError(f"configuration {c.id!r}: its slice has {got}, the bundle's "
                                  f"OOD statistics need [1, {dim}] features (re-export)")
            fi = self._feat[c.id] = int(outs[1]["index"])
        return fi

    def _numpy_score(self, c: Configuration, interps: list[Interp], wk: str) -> float:
        """One sample's score in numpy from the interpreter's features (and logits): where no
        graph computes it (a version-1 file, or a slice that could not take the ops)."""
        assert self._unc is not None  # (asked only with the statistics)
        it, _, out, _ = interps[0]
        return self._unc.score_one(wk, it.get_tensor(self._feature_index(c, it)),
                                   it.get_tensor(out), c.samples if c.scope == "head" else 1)

    def _set_one(self, key: str, alpha: float | None, probs: list[float], label: int
                 ) -> tuple[int, ...] | None:
        """The conformal set of one answer at ``key``'s quantile (None: no quantile)."""
        q, unc = self._qhat(key, alpha), self._unc
        return None if q is None or unc is None else unc.set_one(probs, q, self.conformal, label)

    def _qhat(self, key: str, alpha: float | None) -> float | None:
        a = self.alpha if alpha is None else alpha
        q = self._qhats.get((key, a), False)
        if q is False:
            q = self._qhats[(key, a)] = self._unc.qhat(key, self.conformal, a)
        return q

    def _uncertain(self, c: Configuration, probs: list[float], interps: list[Interp],
                   key: str, alpha: float | None, label: int, probe: bool = False
                   ) -> tuple[float | None, bool | None, tuple[int, ...] | None]:
        """(OOD score of the answering slice's features, in distribution, conformal set at
        the quantile of ``key``: the configuration, or the cascade plan that answered, always
        holding ``label``, the answer: the non-empty rule of edge_sdk.answers.conformal).
        ``probe``: zero features, to measure the cost (load time)."""
        score: float | None = None
        ind: bool | None = None
        pset: tuple[int, ...] | None = None
        unc = self._unc
        if unc is None:  # callers ask only with the bundle's statistics
            return score, ind, pset
        wk = self._unc_width.get(c.id)
        if wk is not None:
            oi = self._ood_at.get(c.id, (-1, 0.0))[0]
            if probe:  # the score's own cost: numpy's (a version-1 file), else one read
                score = 0.0 if unc.version > 1 else unc.score_one(
                    wk, np.zeros(unc.widths[wk].dim, np.float32))
            elif oi >= 0 and len(interps) == 1:
                score = interps[0][0].get_tensor(oi).item(0)
            else:
                score = self._numpy_score(c, interps, wk)
            ind = score <= unc.widths[wk].threshold
        q = self._qhat(key, alpha)
        if q is not None:
            pset = unc.set_one(probs, q, self.conformal, label)
        return score, ind, pset

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

    def _learn(self, times: list[tuple[Configuration, float]], total: float, built: float,
               n: int = 1) -> None:
        """Observe each stage's end-to-end share: its own time plus the call's fixed part
        (input checks, planning), without building/resizing time."""
        fixed = max(total - built - sum(t for _, t in times), 0.0)
        with self._lock:
            for c, t in times:
                self.policy.observe(c.id, t + fixed, n)

    def _config(self, config_id: object) -> Configuration:
        if not isinstance(config_id, str):
            raise ConfigError(f"config_id must be a configuration id (a string: "
                              f"{', '.join(self._configs)}), got {type(config_id).__name__}")
        if config_id in self.left_out:
            raise BackendError(f"{config_id}: backend {self.backend} would answer it wrongly "
                               f"({self.left_out[config_id]}); the others answer")
        return self._configs.get(config_id) or self.manifest.configuration(config_id)  # raises

    def _pinned(self, config_id: str, budget: Budget, n: int) -> Stage:
        plan = self._pinned_plans.get(config_id) if type(config_id) is str else None
        if plan is None:
            plan = self._pinned_plans[config_id] = (Stage(self._config(config_id), None, 0.0),)
        stage = plan[0]
        if self.strict:
            with self._lock:
                self.policy.check_pinned(stage.config, budget, n)
        return stage

    def _width_config(self, width: object, config_id: object) -> str:
        """The id of the point configuration that answers for ``width`` now: its precision
        variant judged fastest (edge_sdk.policy.variants). ConfigError for a width the
        bundle has no point configuration of, or with ``config_id`` given too."""
        if config_id is not None:
            raise ConfigError("pass config_id or width, not both (config_id pins one "
                              "configuration, width pins a width and leaves its precision)")
        point = self._widths.get(width) if type(width) is float else None  # (a call's lookup)
        if point is None:
            w = float(width) if isinstance(width, numbers.Real) and not isinstance(width, bool) \
                else math.nan
            if not 0 < w <= 1:
                raise ConfigError(f"width must be a number in (0, 1], got {width!r}")
            key = width_key(w)
            found = [c for c in self.policy.configs
                     if c.scope == "point" and width_key(c.width) == key]
            if not found:
                have = sorted({width_key(c.width) for c in self.policy.configs
                               if c.scope == "point"})
                raise ConfigError(f"no point configuration of width {key}; the bundle has "
                                  f"widths {', '.join(have) or 'none'}")
            point = found[0]
            if type(width) is float:
                self._widths[width] = point
        return self.policy.active_variant(point).id

    def _sdk_overhead_ms(self, repeats: int = 15) -> dict[str, float]:
        """The SDK's own time per call outside the interpreter (input checks, normalisation,
        the answer's maths), measured here on this host, so an unmeasured configuration's
        end-to-end prior is its invoke prior plus this. Keyed by the answer's shape."""
        lo, hi = self.manifest.input.value_range
        x = np.full(self._inputs.want, (lo + hi) / 2,
                    np.uint8 if self.manifest.input.dtype == "uint8" else np.float32)
        by_shape: dict[tuple[int, int, bool], float] = {}
        out = {}
        for c in self.manifest.configurations:
            rows = 1 if c.scope == "point" else c.samples
            graph = c.files[0].name in self._answerable  # edge_sdk.answers.graph
            shape = (rows, c.invokes, graph)
            if shape not in by_shape:
                logits = np.zeros((rows, self._classes), np.float32)
                p = np.full((1, self._classes), 1 / self._classes, np.float32)
                unc, wk = self._unc, self._unc_width.get(c.id)
                zeros = np.zeros(unc.widths[wk].dim if unc and wk else 1, np.float32)
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    xn = self._inputs.feed(x)
                    if self._suspect is not None:
                        self._suspect.one(xn)
                    top = (answer_top(c, p, logits if c.scope == "head" else None) if graph
                           else lean_top(c, logits))
                    if top is not None:  # _execute_one's lean answer, the set made when read
                        lp, lab, conf, lz = top
                        if unc and wk and unc.version == 1:  # scored in numpy, else one read
                            unc.score_one(wk, zeros)
                        lean_answer(c, self._labels, lab, conf, lz, False, 0.0, 0.0, True, None,
                                    lp)
                    else:
                        pr, h, mi, lab, conf = probabilities(c, logits)
                        # the score and the set: their own cost
                        self._uncertain(c, pr, [], c.id, None, lab, probe=True)
                        answer(c, self._labels, pr, h, mi, lab, conf, False, 0.0, 0.0, True)
                    times.append(time.perf_counter() - t0)
                by_shape[shape] = statistics.median(times) * 1e3
            out[c.id] = by_shape[shape]
        return out

    def _execute_one(self, xn: npt.NDArray[Any], stages: tuple[Stage, ...], budget: Budget,
                     t0: float, alpha: float | None = None, suspect: bool | None = None
                     ) -> Prediction:
        clock = self._clock
        if len(stages) == 1:  # the common case, kept lean: this is all SDK time
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
            unc = self._unc
            # fields wait until read (probs, entropy, mutual info, the set); the OOD score is
            # read now (abstain needs it), from the interpreter when its graph computed it
            if top is not None:
                lean_probs, label, conf, lazy = top
                if unc is not None:
                    at = self._ood_at.get(c.id)  # (the graph's score output or -1, threshold)
                    if at is not None:
                        ood = it.get_tensor(at[0]).item(0) if at[0] >= 0 and len(interps) == 1 \
                            else self._numpy_score(c, interps, self._unc_width[c.id])
                        ind = ood <= at[1]
                    lazy = (with_set, (lazy, self._set_one, c.id, alpha, label, lean_probs))
            else:  # a head's row underflowed (its logits were read)
                assert logits is not None
                probs, entropy, mi, label, conf = probabilities(c, logits)
                if unc is not None:
                    ood, ind, pset = self._uncertain(c, probs, interps, c.id, alpha, label)
            threshold = c.thresholds[self._target_key]
            abstain = threshold is None or conf < threshold or (self.abstain_on_ood and (
                ind is False or suspect is True))  # prediction.abstains(), inline
            total = (clock() - t0) * 1000
            policy = self.policy
            with self._lock:
                policy.observe(c.id, total - built)
            met = (budget.latency_ms is None or total <= budget.latency_ms) and \
                policy.fits_memory(c, budget)
            if top is not None:
                return lean_answer(c, self._labels, label, conf, lazy, abstain, total, invoke,
                                   met, suspect, lean_probs, ood, ind, unc is not None)
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
                d.config, d.probs, interps, self._set_key(stages, d.config, cut), alpha,
                d.label)
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
            first, second = stages[0].config.id, stages[1].config.id
            # the plan for this target accuracy (schema version 8), else the plan's own
            for key in (cascade_key(first, second, self._target_key),
                        cascade_key(first, second)):
                if key in unc.quantiles:
                    return key
        return answered.id

    def _scores(self, c: Configuration, interps: list[Interp], n: int
                ) -> npt.NDArray[np.float64] | None:
        """``c``'s OOD scores ``[n]`` after an invoke at batch ``n`` (None: ``c`` has none)."""
        wk = self._unc_width.get(c.id) if self._unc is not None else None
        if self._unc is None or wk is None:
            return None
        it, _, out, _ = interps[0]
        oi = self._ood_at.get(c.id, (-1, 0.0))[0]
        if oi >= 0 and len(interps) == 1:  # the graph's output, else numpy on its features
            return it.get_tensor(oi).reshape(n).astype(np.float64)  # type: ignore[no-any-return]
        f = it.get_tensor(self._feature_index(c, it)).reshape(n, -1)
        return self._unc.score(wk, f, it.get_tensor(out), c.samples if c.scope == "head" else 1)
