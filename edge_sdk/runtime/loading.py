"""``edge_sdk.load``: read, verify and check a bundle into an :class:`~.model.EdgeModel`."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from edge_sdk.runtime.model import EdgeModel
    from edge_sdk.device.readers import Readers
    from edge_sdk.policy.rules import Rule
    from edge_sdk.trust.signing import KeyLike

__all__ = ["load"]

def load(bundle_dir: str | os.PathLike[str], profile: str | os.PathLike[str] | None = "auto",
         threads: int | None = None, *, policy: str = "best", target_accuracy: float = 0.95,
         strict: bool = False, memory_cap_mb: float | None = None, backend: str | None = None,
         trusted_keys: Iterable[KeyLike] | KeyLike | None = None,
         hysteresis: float = 0.1, half_life_s: float = 10.0, half_life_calls: int = 200,
         uncertainty: bool = True, alpha: float = 0.1, conformal: str = "lac",
         abstain_on_ood: bool = True, input_check: bool = True,
         memory_reader: Callable[[], float] | None = None,
         clock: Callable[[], float] = time.perf_counter,
         rules: Iterable[Rule] | Rule | None = None, readers: Readers | None = None,
         monitor_interval_s: float = 0.1) -> EdgeModel:
    """Load and verify a bundle (schema version, every file's sha256) before anything runs.

    A store bundle (schema version 3 or 4, ``layout: store``): ``store.bin`` is read once, its size
    and sha256 checked, and decoded; one slice per distinct graph (per width: the point slice,
    a sampled slice, the head slice with the most heads) is materialised, checked against the
    manifest's sha256 and tensors and parsed by the backend here, so a broken store or a
    materialiser that disagrees with the exporter fails now. Every other slice is materialised
    and checked the same way on first use (a first-use cost, ``first_use_ms``, never part of
    the latency estimate).

    ``profile`` seeds the latency the policy expects of each configuration until this process
    has measured it: "auto" (a measured profile cached by ``edge-sdk profile`` for this bundle
    and host, else the manifest's host measurements), a built-in device profile name
    (``raspberry_pi_4``, ...), a profile YAML path, or None (manifest only). ``threads`` is
    the interpreter thread count (None: the runtime's default). ``backend`` picks the TFLite
    interpreter: "litert", "tflite-runtime" or None (``EDGE_SDK_BACKEND``, else the first
    installed, LiteRT first); a bundle the backend would answer wrongly raises BackendError.
    Keyword arguments: ``policy`` ("best" or "cascade"), ``target_accuracy``, ``strict`` (raise
    :class:`BudgetNotMetError` instead of answering outside the budget), ``memory_cap_mb``
    (resident interpreters per thread, and a store bundle's materialised slice bytes, least
    recently used evicted first; also a memory limit of every decision), ``trusted_keys``
    (Ed25519 public keys, PEM paths or bytes: only a bundle whose manifest one of them signed
    loads, with nothing unlisted in it; docs/signing.md), and the
    policy's tunables ``hysteresis`` (headroom a better configuration needs to replace the
    incumbent, default 0.1), ``half_life_s`` / ``half_life_calls`` (how fast a measurement
    ages toward the prior, default 10 s / 200 decisions).

    Args:
        bundle_dir: the bundle directory (``manifest.yaml`` and its files).
        profile: "auto", a built-in device profile name, a profile YAML path, or None.
        threads: interpreter threads (None: the runtime's default).
        policy: "best" (the best configuration that fits) or "cascade" (narrow first, widen
            when unsure).
        target_accuracy: which exported confidence threshold ``abstain`` uses.
        strict: raise :class:`BudgetNotMetError` instead of answering outside the budget.
        memory_cap_mb: resident interpreters (and store slices) per thread, LRU-evicted; also
            a memory limit of every decision.
        backend: "litert", "tflite-runtime" or None (``EDGE_SDK_BACKEND``, else the first
            installed).
        trusted_keys: Ed25519 public keys (PEM paths or bytes); only a bundle one of them
            signed loads.
        hysteresis: headroom a better configuration needs to replace the incumbent.
        half_life_s: seconds after which a latency measurement counts half toward the prior.
        half_life_calls: decisions after which it counts half.
        uncertainty: compute ``ood_score``, ``in_distribution`` and ``prediction_set``
            (docs/uncertainty.md; False: those fields are None and the call costs only the
            answer).
        alpha: the prediction sets' miscoverage (coverage >= 1 - alpha).
        conformal: the sets' score, "lac", "aps" or "raps".
        abstain_on_ood: ``abstain`` also when the input is unlike the training data:
            ``in_distribution`` False or ``input_suspect`` True.
        input_check: compute ``input_suspect`` (the sample's per-channel mean and
            maximum against the training split's, from the manifest's ``input_stats``;
            False, or a bundle without them: None).
        memory_reader: MB available now (tests; default psutil).
        clock: the timer every latency is measured with (tests; default perf_counter).
        rules: device rules the policy applies while their readings call for it
            (``edge_sdk.OnBattery``, ``WhenHot``, ``UnderMemoryPressure``,
            ``UnderContention``; docs/runtime.md, Device rules).
        readers: the device readers (default psutil; tests and simulations inject theirs).
        monitor_interval_s: how often the device is read, off the call path (default 0.1 s).
    """
    from edge_sdk.runtime.model import EdgeModel  # (a module-level import adds a link)

    return EdgeModel(bundle_dir, profile=profile, threads=threads, policy=policy,
                     target_accuracy=target_accuracy, strict=strict,
                     memory_cap_mb=memory_cap_mb, backend=backend, trusted_keys=trusted_keys,
                     hysteresis=hysteresis, half_life_s=half_life_s,
                     half_life_calls=half_life_calls, uncertainty=uncertainty, alpha=alpha,
                     conformal=conformal, abstain_on_ood=abstain_on_ood,
                     input_check=input_check, memory_reader=memory_reader, clock=clock,
                     rules=rules, readers=readers, monitor_interval_s=monitor_interval_s)
