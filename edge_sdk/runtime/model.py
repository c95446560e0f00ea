"""The on-device runtime: load a bundle, set budgets, ``predict``. numpy + a TFLite interpreter.

    model = edge_sdk.load("bundle/")
    model.budget = edge_sdk.Budget(latency_ms=5)
    p = model.predict(x)          # x: one sample, shape manifest.input.shape[1:]
    p.label, p.confidence, p.mutual_info, p.abstain, p.width, p.latency_ms, p.invoke_ms

The policy (:mod:`edge_sdk.policy.policy`) decides and plans every call; this module only checks the
input, executes the plan's stages on per-thread interpreters and measures what the app waited.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import numpy.typing as npt

from edge_sdk.answers.graph import RawInput
from edge_sdk.backends import check_bundle, interpreter_class
from edge_sdk.policy.budget import Budget, MemoryProbe, check_budget
from edge_sdk.bundle.reading import read_manifest
from edge_sdk.store.sources import SliceSource, open_slices
from edge_sdk.errors import ConfigError
from edge_sdk.runtime.explain import Explanation, decision_table
from edge_sdk.inputs.stats import SuspectCheck
from edge_sdk.inputs.photos import Sample, Samples, input_checker
from edge_sdk.policy.plan import MODES, Stage
from edge_sdk.policy.policy import Policy
from edge_sdk.bundle.slices import read_verified
from edge_sdk.answers.prediction import BatchPrediction, Prediction, draft, finish
from edge_sdk.answers.uncertainty import Uncertainty, check_alpha
from edge_sdk.runtime.recorder import TraceRecorder
from edge_sdk.runtime.residency import PerThread, Residency
from edge_sdk.runtime.device import use_rules
from edge_sdk.runtime.warm import warm, warm_set
from edge_sdk.runtime.execute_batch import BatchExecutor
from edge_sdk.runtime.startup import (answerable, check_load_args, latency_priors,
                                      uncertainty_widths)

if TYPE_CHECKING:
    from edge_sdk.bundle.manifest import Manifest
    from edge_sdk.bundle.input_spec import InputSpec
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.device.readers import Readers
    from edge_sdk.device.state import DeviceState
    from edge_sdk.policy.rules import Rule
    from edge_sdk.trust.signing import KeyLike

__all__ = ["BatchPrediction", "EdgeModel", "Prediction"]
POLICIES = MODES


class EdgeModel(BatchExecutor, Residency):
    """A loaded bundle. Thread-safe: each thread gets its own interpreters (LiteRT interpreters
    are not thread-safe), created lazily, warmed up by one invoke, and kept resident up to
    ``memory_cap_mb`` per thread."""

    def __init__(self, bundle_dir: str | os.PathLike[str], *,
                 profile: str | os.PathLike[str] | None = "auto",
                 threads: int | None = None,
                 target_accuracy: float = 0.95, policy: str = "best", strict: bool = False,
                 memory_reader: Callable[[], float] | None = None,
                 memory_cap_mb: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 backend: str | None = None, hysteresis: float = 0.1,
                 half_life_s: float = 10.0, half_life_calls: int = 200,
                 trusted_keys: Iterable[KeyLike] | KeyLike | None = None, uncertainty: bool = True, alpha: float = 0.1,
                 conformal: str = "lac", abstain_on_ood: bool = True,
                 input_check: bool = True, rules: Iterable[Rule] | Rule | None = None,
                 readers: Readers | None = None, monitor_interval_s: float = 0.1) -> None:
        # every argument typed here (numpy numbers made Python ones), one error type each
        target_accuracy, memory_cap_mb, threads = check_load_args(
            bundle_dir, profile, threads, policy, target_accuracy, strict, memory_cap_mb,
            uncertainty=uncertainty, abstain_on_ood=abstain_on_ood, input_check=input_check,
            conformal=conformal, backend=backend, memory_reader=memory_reader, clock=clock)
        self.alpha = check_alpha(alpha)
        self.conformal, self.abstain_on_ood = conformal, abstain_on_ood
        self.bundle_dir = Path(bundle_dir)
        if trusted_keys is None:
            self.manifest: Manifest = read_manifest(self.bundle_dir, verify=False)
        else:  # the manifest's bytes verified against the keys before parsing
            from edge_sdk.trust.signing import read_trusted_manifest

            self.manifest = read_trusted_manifest(self.bundle_dir, trusted_keys)
        self.signed = trusted_keys is not None
        # interpreters are built from these verified bytes only (a file swapped after load()
        # never runs). A files bundle: every slice read once here, sha256-verified and
        # shape-checked on those bytes. A store bundle: store.bin read once here and verified;
        # each slice materialised from it on first use and verified (sha256 == the manifest's,
        # tensors) before any interpreter sees it, cached LRU under memory_cap_mb
        self._slices: SliceSource = open_slices(self.bundle_dir, self.manifest, memory_cap_mb)
        # the OOD statistics and conformal quantiles, verified like the weights
        self._unc: Uncertainty | None = None
        if uncertainty and self.manifest.uncertainty is not None:
            entry = self.manifest.uncertainty
            self._unc = Uncertainty.from_bytes(read_verified(self.bundle_dir, entry),
                                               f"{self.bundle_dir}: {entry.name}")
        self._unc_width = uncertainty_widths(self.manifest, self._unc, self.bundle_dir)
        self._feat: dict[str, int] = {}  # config id -> its features output's tensor index
        self._ood_at: dict[str, tuple[int, float]] = {}  # residency: the score's output
        self._qhats: dict[tuple[str, float], float | None] = {}
        key = f"{target_accuracy:g}"
        missing = [c.id for c in self.manifest.configurations if key not in c.thresholds]
        if missing:
            have = sorted(self.manifest.configurations[0].thresholds)
            raise ConfigError(f"target_accuracy {key} has no exported threshold; the bundle "
                              f"has thresholds for {', '.join(have)}")  # a load() argument
        self.target_accuracy, self.policy_name, self.strict = target_accuracy, policy, strict
        self._target_key = key
        self.threads = threads
        self._interp_cls, self.backend = interpreter_class(backend)  # BackendError if none
        # nothing it answers wrongly, and every slice parses with this backend (a store
        # bundle: one materialised, verified slice per distinct graph, see load_check)
        checked, stand_ins = self._slices.load_check()
        # a configuration this backend would answer wrongly is left out (id -> why)
        self.left_out = check_bundle(self.bundle_dir, self.manifest, self.backend, checked,
                                     self._interp_cls, stand_ins)
        del checked
        runnable = [c for c in self.manifest.configurations if c.id not in self.left_out]
        self.profile, self.latency_source, priors = latency_priors(
            self.bundle_dir, self.manifest.configurations, profile, threads)
        # the input check asks isinstance(x, np.ma.MaskedArray): numpy loads numpy.ma on that
        # first use (40-75 ms, measured), so load() imports it, not the first predict()
        import numpy.ma  # noqa: F401
        self._inputs = input_checker(self.manifest.input)  # photos too, with input.preprocess
        # every interpreter takes the raw sample and normalises it in its graph
        self._raw = RawInput(self._inputs.feed_dtype.name, self._inputs.scale_c,
                             self._inputs.shift_c)
        # input_suspect: the sample's raw statistics against the training split's
        stats = self.manifest.input_stats
        self._suspect = SuspectCheck(stats) if input_check and stats is not None else None
        self._classes = len(self.manifest.labels)
        self._labels = tuple(self.manifest.labels)
        self._configs = {c.id: c for c in runnable}
        self.memory_cap_mb = memory_cap_mb
        # the answer's softmax in the graph, where a slice serves one configuration
        self._answerable = answerable(self.manifest.configurations)
        self.policy = Policy(
            runnable, MemoryProbe(memory_reader), priors=priors,
            hysteresis=hysteresis, half_life_s=half_life_s, half_life_calls=half_life_calls,
            overhead_ms=self._sdk_overhead_ms(), prior_source=self.latency_source,
            memory_cap_mb=self.memory_cap_mb, mode=policy, target=key)
        if self.memory_cap_mb is not None:
            small = min(runnable, key=self.policy.memory_need_mb)
            if self.policy.memory_need_mb(small) > self.memory_cap_mb:
                raise ConfigError(  # a load() argument, not a budget
                    f"memory_cap_mb {self.memory_cap_mb:g} MB is below every configuration's "
                    f"memory need: the smallest, {small.id}, needs "
                    f"{self.policy.memory_need_mb(small):.4g} MB")
        # the device rules: readings off the call path, contention from the calls
        self._monitor = use_rules(self.policy, rules, readers, monitor_interval_s)
        self._share_mb = self._file_shares()
        self.budget = Budget()
        self._clock = clock
        self._local = PerThread()
        self._lock = threading.Lock()  # the policy's EWMA and hysteresis state
        self._batchable: dict[str, bool] = {}
        self._pinned_plans: dict[str, tuple[Stage]] = {}  # config_id -> its one-stage plan
        self._widths: dict[float, Configuration] = {}  # predict(width=...)'s look-ups
        self._recorder: TraceRecorder | None = None

    # ---- public ----------------------------------------------------------------------------
    @property
    def uncertainty(self) -> Uncertainty | None:
        """The bundle's OOD statistics and conformal quantiles (None: the bundle has none, or
        ``load(uncertainty=False)``)."""
        return self._unc

    @property
    def device(self) -> DeviceState | None:
        """The device monitor's last reading (None: the model has no device rules)."""
        return None if self._monitor is None else self._monitor.state

    @property
    def engaged_rules(self) -> dict[str, str]:
        """The device rules acting now: rule name -> the reading that engaged it."""
        rules = self.policy.rules
        if rules is None:
            return {}
        with self._lock:
            if rules.stale():  # a reading since the last call: what the next call acts on
                self.policy._rerank()
            return dict(rules.engaged)

    def close(self) -> None:
        """Stop the device monitor's timer (it also ends when the model is collected)."""
        if self._monitor is not None:
            self._monitor.stop()

    @property
    def input_spec(self) -> InputSpec:
        return self.manifest.input

    @property
    def budget(self) -> Budget:
        return self._budget

    @budget.setter
    def budget(self, value: Budget) -> None:
        self._budget = check_budget(value, "budget")

    @property
    def first_use_ms(self) -> dict[str, float]:
        """Per configuration built in this process: interpreter creation + the first (warm-up)
        invoke, the cost a cold configuration adds to one call and never to the estimate."""
        return dict(self.policy.first_use_ms)

    @property
    def materialize_ms(self) -> dict[str, float]:
        """A store bundle: per file materialised in this process, the ms of its last
        materialisation + verification (sha256, tensors), part of its configuration's
        first-use cost; empty for a files bundle (read and verified at load)."""
        return dict(getattr(self._slices, "materialize_ms", {}))

    def predict(self, x: Sample, budget: Budget | None = None, *, config_id: str | None = None,
                alpha: float | None = None, width: float | None = None) -> Prediction:
        """One sample of shape ``input.shape[1:]`` (NHWC without the batch axis; a grey model
        also takes ``[H, W]``); a bundle that records its photo transform (``input.preprocess``)
        also takes a photo: an image file's path, a Pillow image, or a uint8 array of any other
        size (docs/runtime.md, Photos). ``budget``: an :class:`edge_sdk.Budget` for this call
        (None: the model's). ``config_id`` pins a configuration (benchmarks, debugging) instead of
        letting the policy choose; its ``budget_met`` is still judged against the budget and
        strict mode still raises when it is predicted not to fit. ``width`` pins the width's
        point network and leaves its precision to the policy (the variant judged fastest).
        ``alpha``: this call's conformal miscoverage (None: the model's, ``load(alpha=0.1)``)."""
        t0 = self._clock()
        budget = self._budget if budget is None else check_budget(budget)
        if alpha is not None:
            check_alpha(alpha)
        if width is not None:  # the width's point network, its precision the policy's
            config_id = self._width_config(width, config_id)
        xn = self._inputs.feed(x)
        chk = self._suspect
        sus = None if chk is None else chk.one(xn)  # the checked raw values (a photo prepared)
        stages: tuple[Stage, ...] | None
        if config_id is not None:
            # the pinned one-stage plan, looked up inline; strict mode checks it
            stages = self._pinned_plans.get(config_id) if type(config_id) is str else None
            if stages is None or self.strict:
                stages = (self._pinned(config_id, budget, 1),)
        else:
            with self._lock:
                stages = self.policy.call_stages(budget, self.strict)
        p = self._execute_one(xn, stages, budget, t0, alpha, sus)
        if self._recorder is not None:
            self._recorder.add((p,), budget)
        return p

    def predict_batch(self, xs: Samples, budget: Budget | None = None, *,
                      config_id: str | None = None, alpha: float | None = None,
                      width: float | None = None) -> BatchPrediction:
        """``N`` samples ``[N, *input.shape[1:]]`` under one decision and one per-batch budget:
        one invoke per configuration for the whole batch where the slice's batch dimension can
        be resized, else a loop over the same configuration. Every prediction carries the
        batch's wall time (``latency_ms``) and interpreter time (``invoke_ms``). Returns a
        :class:`BatchPrediction`: the predictions as a sequence, and ``labels``,
        ``confidence``, ``probs``, ``abstain``, ``ood_score``, ``in_distribution`` and
        ``prediction_sets`` (an ``[N, C]`` boolean mask) as arrays; ``width``: see predict.
        A photo bundle also takes a sequence of samples and photos, each as predict takes it."""
        t0 = self._clock()
        budget = self._budget if budget is None else check_budget(budget)
        if alpha is not None:
            check_alpha(alpha)
        if width is not None:
            config_id = self._width_config(width, config_id)
        xn = self._inputs.feed_batch(xs)
        n = len(xn)
        sus = None if self._suspect is None else self._suspect.batch(xn)
        stages: tuple[Stage, ...]
        if config_id is not None:
            stages = (self._pinned(config_id, budget, n),)
        else:
            with self._lock:
                stages = self.policy.call_stages(budget, self.strict, n)
        # one sample: the single-call path (the same answer, without the batch bookkeeping)
        out = BatchPrediction([self._execute_one(
            xn, stages, budget, t0, alpha, None if sus is None else bool(sus[0]))],
            self._classes) if n == 1 else self._execute_batch(xn, stages, budget, t0, alpha, sus)
        out.stage_ids = tuple(s.config.id for s in stages)  # its config_id: the last that ran
        if self._recorder is not None:
            self._recorder.add(out, budget)
        return out

    def explain(self, budget: Budget | None = None, n: int = 1) -> Explanation:
        """The decision table the policy would use for a call now (changes no state): per
        configuration its predicted end-to-end latency and where that comes from, first-use
        cost, memory need, whether it fits, quality rank; the choice and the reason."""
        budget = self._budget if budget is None else check_budget(budget)
        with self._lock:
            return decision_table(self.policy, budget, n, self.policy_name)

    def warm_up(self, budget: Budget | None = None, config_ids: Iterable[str] | None = None,
                *, batch_size: int = 1) -> dict[str, float]:
        """Make the next call as fast as the hundredth: build in this thread the interpreters
        a call under ``budget`` could run now (the plan's stages and their precision
        variants; or those of ``config_ids``) and call each end to end
        :data:`~edge_sdk.runtime.warm.WARM_CALLS` times on a synthetic sample (the training
        mean), so the policy's estimates are measured on this device. ``batch_size`` > 1:
        also ``predict_batch`` at that size (the interpreters resized, the batch latency
        measured). Returns the first-use ms per configuration built (creation + first invoke,
        never part of an estimate)."""
        if config_ids is None:
            budget = self._budget if budget is None else check_budget(budget)
            with self._lock:
                stages = [s.config for s in self.policy.preview(budget).stages]
                configs = warm_set(stages, [self.policy.variants(c) for c in stages])
        else:
            configs = [self._config(cid) for cid in config_ids]
        return warm(self, configs, batch_size)

    def record(self, path: str | os.PathLike[str], phase: str = "live",
               flush_every: int = 1000) -> TraceRecorder:
        """Record every prediction from now on into ``path`` (the demo's trace format, for
        ``edge-sdk report BUNDLE --trace path``). Use as a context manager or ``close()`` it."""
        run = {"bundle": str(self.bundle_dir), "backend": self.backend,
               "policy": self.policy_name, "threads": self.threads}
        rec = TraceRecorder(run, self._stop_recording, path, phase, flush_every)
        with self._lock:
            if self._recorder is not None and not self._recorder.closed:
                raise ConfigError(f"already recording to {self._recorder.path}; close() it "
                                  f"first")
            self._recorder = rec
        return rec

    def _stop_recording(self, rec: TraceRecorder) -> None:
        with self._lock:
            if self._recorder is rec:
                self._recorder = None

    # ---- internals -------------------------------------------------------------------------
    def _prepare(self, x: npt.ArrayLike, what: str = "x") -> np.ndarray:
        """One sample checked and normalised, ``[1, H, W, C]`` float32: what a slice's own
        graph takes (``_build(c, plain=True)``: benchmarks, tests)."""
        return self._inputs.one(x, what)

    def _feed(self, x: npt.ArrayLike, what: str = "x") -> np.ndarray:
        """One sample checked: ``[1, H, W, C]`` raw values, what the interpreters take (tests)."""
        return self._inputs.feed(x, what)

    def _answer(self, c: Configuration, logits: np.ndarray, latency_ms: float,
                met: bool) -> Prediction:
        """The prediction ``c``'s ``[S, C]`` logits make (tests of the maths)."""
        return finish(draft(c, logits), self._labels, self._target_key, latency_ms, 0.0, met,
                      abstain_on_ood=self.abstain_on_ood)

    def _run(self, c: Configuration, x: np.ndarray) -> tuple[np.ndarray, float]:
        """[S, C] logits of one sample (``_feed``'s raw values) and the invokes' time (tests)."""
        interps, _ = self._resident(c, 1)
        return self._invoke(interps, x)
