"""The on-device runtime: load a bundle, set budgets, ``predict``. numpy + a TFLite interpreter.

    model = edge_sdk.load("bundle/")
    model.budget = edge_sdk.Budget(latency_ms=5)
    p = model.predict(x)          # x: one sample, shape manifest.input.shape[1:]
    p.label, p.confidence, p.mutual_info, p.abstain, p.width
"""
from __future__ import annotations

import math
import operator
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from edge_sdk.backends import check_bundle, interpreter_class
from edge_sdk.bundle import Configuration, Manifest, read_manifest, resolve_file
from edge_sdk.errors import BudgetError, InputError
from edge_sdk.policy import Budget, MemoryProbe, Policy
from edge_sdk.profiles import DeviceProfile, find_cached, load_profile, manifest_sha256

POLICIES = ("best", "cascade")


@dataclass(frozen=True)
class Prediction:
    label: int
    class_name: str
    probs: tuple[float, ...]  # calibrated (the configuration's temperature), model-averaged
    confidence: float  # max of probs
    entropy: float  # predictive entropy H[mean_s p_s] (nats)
    mutual_info: float  # predictive - expected entropy, >= 0 (0 for a point configuration)
    abstain: bool  # confidence below the threshold exported for the target accuracy
    width: float
    scope: str
    samples: int
    config_id: str
    latency_ms: float
    budget_met: bool

    def to_dict(self) -> dict:
        return asdict(self)


class EdgeModel:
    """A loaded bundle. Thread-safe: each thread gets its own interpreters (LiteRT interpreters
    are not thread-safe), created lazily and kept resident up to ``memory_cap_mb`` per thread."""

    def __init__(self, bundle_dir: str | Path, *, profile: str | os.PathLike | None = "auto",
                 threads: int | None = None,
                 target_accuracy: float = 0.95, policy: str = "best", strict: bool = False,
                 memory_reader: Callable[[], float] | None = None,
                 memory_cap_mb: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 backend: str | None = None):
        self.bundle_dir = Path(bundle_dir)
        self.manifest: Manifest = read_manifest(self.bundle_dir, verify=True)  # sha256 first
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise BudgetError(f"threads must be a positive integer or None, got {threads!r}")
        if policy not in POLICIES:
            raise BudgetError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if isinstance(target_accuracy, bool) or not isinstance(target_accuracy, (int, float)) \
                or not 0 < target_accuracy <= 1:
            raise BudgetError(f"target_accuracy must be a number in (0, 1], got "
                              f"{target_accuracy!r}")
        key = f"{target_accuracy:g}"
        missing = [c.id for c in self.manifest.configurations if key not in c.thresholds]
        if missing:
            have = sorted(self.manifest.configurations[0].thresholds)
            raise BudgetError(f"target accuracy {target_accuracy} has no exported threshold; "
                              f"the bundle has thresholds for {', '.join(have)}")
        self.target_accuracy, self.policy_name, self.strict = target_accuracy, policy, strict
        self._target_key = key
        self.threads = threads
        self._interp_cls, self.backend = interpreter_class(backend)  # BackendError if none
        check_bundle(self.bundle_dir, self.manifest, self.backend)  # nothing it answers wrongly
        self.profile, self.latency_source, priors = self._priors(profile)
        self.policy = Policy(self.manifest.configurations, MemoryProbe(memory_reader),
                             priors=priors)
        self.budget = Budget()
        self.memory_cap_mb = memory_cap_mb
        self._clock = clock
        self._local = threading.local()
        self._lock = threading.Lock()  # the policy's EWMA and hysteresis state
        spec = self.manifest.input
        std = np.asarray(spec.std, np.float32)
        self._scale = (1.0 / std).astype(np.float32)  # (raw - mean) / std as one multiply-add
        self._shift = (-np.asarray(spec.mean, np.float32) / std).astype(np.float32)
        self._want = tuple(spec.shape[1:])
        self._grey = self._want[:2] if self._want[2] == 1 else None  # [H, W] is accepted too
        lo, hi = spec.value_range
        self._lo = lo - 1e-6 * max(1.0, abs(lo))
        self._hi = hi + 1e-6 * max(1.0, abs(hi))
        self._classes = len(self.manifest.labels)
        self._configs = {c.id: c for c in self.manifest.configurations}

    def _priors(self, profile) -> tuple[DeviceProfile | None, str, dict[str, float]]:
        """Latency believed per configuration before this process has measured it.

        "auto": the measured profile ``edge-sdk profile`` cached for this bundle on this host,
        else the manifest's latencies (measured on the exporting host). A name or path: that
        profile's own latency table when it was measured on this very bundle, else its
        MACs-based estimate (the manifest's host figures describe another machine). None: the
        manifest only."""
        if profile is None:
            return None, "manifest", {}
        configs = self.manifest.configurations
        sha = manifest_sha256(self.bundle_dir)
        if isinstance(profile, str) and profile == "auto":
            prof = find_cached(self.bundle_dir, sha)
            if prof is None:
                return None, "manifest", {}
        else:
            prof = load_profile(profile)
        if prof.bundle_sha256 == sha:
            measured = {c.id: prof.measured_latency_ms(c.id, self.threads) for c in configs}
            if all(v is not None for v in measured.values()):
                return prof, f"measured profile {prof.name}", measured
        return prof, f"profile {prof.name} (MACs estimate)", {
            c.id: prof.estimate_ms(c.macs, c.invokes, self.threads, c.weights) for c in configs}

    # ---- public ----------------------------------------------------------------------------
    @property
    def input_spec(self):
        return self.manifest.input

    @property
    def budget(self) -> Budget:
        return self._budget

    @budget.setter
    def budget(self, value: Budget) -> None:
        if not isinstance(value, Budget):
            raise BudgetError(f"budget must be an edge_sdk.Budget, got {type(value).__name__}")
        self._budget = value

    def predict(self, x, budget: Budget | None = None, *, config_id: str | None = None
                ) -> Prediction:
        """One sample of shape ``input.shape[1:]`` (NHWC without the batch axis; a grey model
        also takes ``[H, W]``, the channel axis added as for training data). ``config_id``
        pins a configuration (benchmarks, debugging) instead of letting the policy choose."""
        x = self._prepare(x, "x")
        if config_id is not None:
            c = self._configs.get(config_id) or self.manifest.configuration(config_id)  # raises
            logits, ms = self._run(c, x)
            with self._lock:
                self.policy.observe(c.id, ms)  # a real measurement on this device all the same
            return self._answer(c, logits, ms, True)
        return self._predict(x, budget or self._budget)

    def predict_batch(self, xs, budget: Budget | None = None) -> list[Prediction]:
        want = tuple(self.manifest.input.shape[1:])
        try:
            xs = np.asarray(xs) if not isinstance(xs, np.ndarray) else xs
        except ValueError as e:  # ragged nesting
            raise InputError(f"xs must be an array of shape [N, {', '.join(map(str, want))}]; "
                             f"got a ragged sequence ({e})") from e
        if self._grey and xs.ndim == len(want) and xs.shape[1:] == self._grey:
            xs = xs[..., None]  # grey [N, H, W]
        if xs.ndim != len(want) + 1 or xs.shape[0] == 0:
            raise InputError(f"xs must have shape [N, {', '.join(map(str, want))}] with N >= 1"
                             + (f" (or [N, {', '.join(map(str, self._grey))}] for grey images)"
                                if self._grey else "") + f", got {list(xs.shape)}")
        return [self.predict(x, budget) for x in xs]

    # ---- internals -------------------------------------------------------------------------
    def _prepare(self, x, what: str) -> np.ndarray:
        want = self._want
        try:
            arr = x if type(x) is np.ndarray else np.asarray(x)
        except (ValueError, TypeError) as e:  # ragged lists and the like
            raise InputError(f"{what} must be an array of shape {list(want)} (NHWC, one sample);"
                             f" got something that is not array-like ({e})") from e
        if arr.shape != want:
            if arr.shape != self._grey:
                raise InputError(f"{what} must have shape {list(want)} (NHWC, one sample"
                                 + (f"; or {list(self._grey)} for a grey image" if self._grey
                                    else "") + f"), got {list(arr.shape)}")
            arr = arr[..., None]  # grey [H, W]: the channel axis, as for training data
        if arr.dtype.kind not in "uif" or arr.dtype == np.bool_:
            raise InputError(f"{what} must be numeric (uint8 or float), got dtype {arr.dtype}")
        # min and max propagate NaN and expose +-inf, so one pass each checks finiteness too;
        # checked before the float32 cast, so a huge float64 is reported as out of range
        lo, hi = float(arr.min()), float(arr.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"{what} contains NaN or infinite values")
        if lo < self._lo or hi > self._hi:
            a, b = self.manifest.input.value_range
            raise InputError(f"{what} values must lie in the raw range [{a:g}, {b:g}] "
                             f"(before normalisation), got [{lo:g}, {hi:g}]")
        return (arr * self._scale + self._shift).astype(np.float32, copy=False)[None]

    def _interpreters(self, c: Configuration) -> list:
        cache: OrderedDict = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = OrderedDict()
        if c.id in cache:
            cache.move_to_end(c.id)
            return cache[c.id]
        interps = []
        for f in c.files:
            it = self._interp_cls(model_path=str(resolve_file(self.bundle_dir, f.name)),
                                  num_threads=self.threads)
            it.allocate_tensors()
            # tensor indices looked up once: get_*_details() costs more than a small invoke
            interps.append((it, it.get_input_details()[0]["index"],
                            it.get_output_details()[0]["index"]))
        cache[c.id] = interps
        if self.memory_cap_mb is not None:
            while len(cache) > 1 and sum(self.policy.memory_need_mb(
                    self.manifest.configuration(k)) for k in cache) > self.memory_cap_mb:
                cache.popitem(last=False)  # least recently used
        return interps

    def _run(self, c: Configuration, x: np.ndarray) -> tuple[np.ndarray, float]:
        """[S, C] logits and the wall time of the invokes."""
        interps = self._interpreters(c)
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

    def _answer(self, c: Configuration, logits: np.ndarray, latency: float,
                met: bool) -> Prediction:
        # The maths of edge_sdk.metrics (predictive entropy H[mean_s p_s], MI = H[mean p] -
        # mean_s H[p_s] clamped at 0), inlined without input validation: this is the hot path.
        # One sample (point configurations): plain floats, several times cheaper than numpy on
        # ten classes; H[p] = log sum e^z - sum p z with z the shifted logits (no log 0).
        inv_t = 1.0 / c.temperature
        if logits.shape[0] == 1:
            row = logits[0].tolist()
            m = max(row)
            e = [math.exp((v - m) * inv_t) for v in row]
            s = sum(e)
            probs = [v / s for v in e]
            # sum_k p_k z_k with z = (row - m) / T, using sum_k p_k = 1
            entropy = max(math.log(s) - inv_t * (sum(map(operator.mul, probs, row)) - m), 0.0)
            mi = 0.0
        else:
            z = logits.astype(np.float64) * inv_t
            z -= z.max(-1, keepdims=True)
            e = np.exp(z)
            s = e.sum(-1, keepdims=True)
            p_s = e / s
            expected = float((np.log(s[:, 0]) - (p_s * z).sum(-1)).mean())
            p = p_s.mean(0)
            entropy = float(-(p * np.log(np.where(p > 0, p, 1.0))).sum())
            mi = max(entropy - expected, 0.0)
            probs = p.tolist()
        label = max(range(len(probs)), key=probs.__getitem__)
        conf = probs[label]
        threshold = c.thresholds[self._target_key]
        return Prediction(
            label=label, class_name=self.manifest.labels[label], probs=tuple(probs),
            confidence=conf, entropy=entropy, mutual_info=mi,
            abstain=threshold is None or conf < threshold, width=c.width, scope=c.scope,
            samples=c.samples, config_id=c.id, latency_ms=latency, budget_met=met)

    def _predict(self, x: np.ndarray, budget: Budget) -> Prediction:
        with self._lock:
            c, met = self.policy.choose(budget, self.strict)
        if self.policy_name == "cascade":
            return self._cascade(x, budget, c, met)
        logits, ms = self._run(c, x)
        with self._lock:
            self.policy.observe(c.id, ms)
        within = budget.latency_ms is None or ms <= budget.latency_ms
        return self._answer(c, logits, ms, met and within)

    def _cascade(self, x: np.ndarray, budget: Budget, best: Configuration,
                 met: bool) -> Prediction:
        """Two-stage cascade, when the bundle has plans for ``best`` (the rule's choice): the
        first stage is the narrower configuration whose plan minimises the expected latency
        ``L(first) + (1 - coverage) L(best)``; it answers when its confidence reaches the plan's
        threshold (fitted at export so that, on validation, accuracy drops by at most
        ``max_loss`` against always running ``best``), else ``best`` runs too, budget
        permitting. Bundles without plans climb the widths with the target-accuracy thresholds.
        """
        if not any(best.id in c.cascade for c in self.policy.configs):
            return self._climb(x, budget, best, met)
        with self._lock:
            lat_best = self.policy.predicted_latency_ms(best)
            plans = [(self.policy.predicted_latency_ms(c)
                      + (1 - c.cascade[best.id]["coverage"]) * lat_best, c)
                     for c in self.policy.configs
                     if best.id in c.cascade and c.cascade[best.id]["threshold"] is not None
                     and self.policy.fits(c, budget)]
        expected, first = min(plans, key=lambda t: t[0], default=(math.inf, None))
        stages = [first, best] if first is not None and expected < lat_best else [best]
        spent = 0.0
        for c in stages:
            logits, ms = self._run(c, x)
            spent += ms
            with self._lock:
                self.policy.observe(c.id, ms)
            answer = self._answer(c, logits, spent, met)
            if c is best or answer.confidence >= c.cascade[best.id]["threshold"]:
                break
            if budget.latency_ms is not None and spent + lat_best > budget.latency_ms:
                break  # no room for the second stage: the first stage's answer stands
        return self._settle(answer, budget)

    def _climb(self, x: np.ndarray, budget: Budget, best: Configuration,
               met: bool) -> Prediction:
        """Cheapest fitting configuration first; escalate to wider ones (same scope) while the
        answer's confidence is below its exported target-accuracy threshold and the budget has
        room left."""
        with self._lock:
            fitting = sorted((c for c in self.policy.configs if c.scope == best.scope
                              and c.width <= best.width and self.policy.fits(c, budget)),
                             key=lambda c: c.width) or [best]
        spent = 0.0
        for i, c in enumerate(fitting):
            logits, ms = self._run(c, x)
            spent += ms
            with self._lock:
                self.policy.observe(c.id, ms)
            answer = self._answer(c, logits, spent, met)
            if not answer.abstain or i + 1 == len(fitting):
                break
            nxt = fitting[i + 1]
            if budget.latency_ms is not None and \
                    spent + self.policy.predicted_latency_ms(nxt) > budget.latency_ms:
                break
        return self._settle(answer, budget)

    @staticmethod
    def _settle(answer: Prediction, budget: Budget) -> Prediction:
        """The cascade's final answer, flagged when the total time overran the budget."""
        if budget.latency_ms is None or answer.latency_ms <= budget.latency_ms:
            return answer
        return replace(answer, budget_met=False)


def load(bundle_dir: str | Path, profile: str | os.PathLike | None = "auto",
         threads: int | None = None, **kwargs) -> EdgeModel:
    """Load and verify a bundle (schema version, every file's sha256) before anything runs.

    ``profile`` seeds the latency the policy expects of each configuration until this process
    has measured it: "auto" (a measured profile cached by ``edge-sdk profile`` for this bundle
    and host, else the manifest's host measurements), a built-in device profile name
    (``raspberry_pi_4``, ...), a profile YAML path, or None (manifest only). ``threads`` is
    the interpreter thread count (None: the runtime's default). ``backend`` picks the TFLite
    interpreter: "litert", "tflite-runtime" or None (``EDGE_SDK_BACKEND``, else the first
    installed, LiteRT first); a bundle the backend would answer wrongly raises BackendError.
    """
    return EdgeModel(bundle_dir, profile=profile, threads=threads, **kwargs)
