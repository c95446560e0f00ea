"""What :func:`edge_sdk.load` works out once, before the first call (split out of runtime.py):
its arguments typed before the bundle is read, the interpreter latency the policy believes of
each configuration until this process has measured it (a device profile or the manifest), the
SDK's own time per call outside the interpreter measured on this host (so an unmeasured
configuration's end-to-end prior is its invoke prior plus that, issue 34 goal 6), and which
width's OOD statistics each configuration reads.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from edge_sdk.answers.maths import answer_top, eager_fields, lean_top, probabilities
from edge_sdk.policy.budget import MAX_MEMORY_MB, bounded_number
from edge_sdk.bundle import Configuration, width_key
from edge_sdk.errors import BundleError, ConfigError, ProfileError
from edge_sdk.policy.policy import MODES
from edge_sdk.answers.prediction import answer, lean_answer
from edge_sdk.policy.profiles import DeviceProfile, find_cached, load_profile, manifest_sha256
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.runtime.model import EdgeModel

__all__ = ["MAX_THREADS", "check_load_args", "latency_priors", "sdk_overhead_ms",
           "uncertainty_widths"]

MAX_THREADS = 1024  # far above any device's cores; LiteRT takes an int32 and overflows above


def check_load_args(profile: object, threads: object, policy: object, target_accuracy: object,
                    strict: object, memory_cap_mb: object) -> None:
    """load()'s arguments, typed before the bundle is read."""
    if profile is not None and not isinstance(profile, (str, os.PathLike)):
        raise ProfileError(f"profile must be 'auto', a built-in profile name, a YAML path or "
                           f"None, got {type(profile).__name__} {profile!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= MAX_THREADS):
        raise ConfigError(f"threads must be an integer in [1, {MAX_THREADS}] or None (the "
                          f"runtime's default), got {show(threads)}")
    if not isinstance(policy, str) or policy not in MODES:
        raise ConfigError(f"policy must be one of {', '.join(MODES)}, got {policy!r}")
    if isinstance(target_accuracy, bool) or not isinstance(target_accuracy, (int, float)) \
            or not 0 < target_accuracy <= 1:
        raise ConfigError(f"target_accuracy must be a number in (0, 1], got "
                          f"{show(target_accuracy)}")
    if not isinstance(strict, bool):
        raise ConfigError(f"strict must be True or False, got {strict!r}")
    if memory_cap_mb is not None:  # bounded: 10**400 raised a raw OverflowError (issue 36)
        bounded_number(memory_cap_mb, "memory_cap_mb", MAX_MEMORY_MB, "MB")


def latency_priors(bundle_dir: Path, configs: Sequence[Configuration],
                   profile: str | os.PathLike[str] | None, threads: int | None
                   ) -> tuple[DeviceProfile | None, str, dict[str, float]]:
    """Interpreter latency believed per configuration before this process has measured it.

    "auto": the measured profile ``edge-sdk profile`` cached for this bundle on this host,
    else the manifest's latencies (measured on the exporting host). A name or path: that
    profile's own latency table when it was measured on this very bundle, else its
    MACs-based estimate (the manifest's host figures describe another machine). None: the
    manifest only."""
    if profile is None:
        return None, "manifest", {}
    sha = manifest_sha256(bundle_dir)
    if isinstance(profile, str) and profile == "auto":
        prof = find_cached(bundle_dir, sha)
        if prof is None:
            return None, "manifest", {}
    else:
        prof = load_profile(profile)
    if prof.bundle_sha256 == sha:
        got = {c.id: prof.measured_latency_ms(c.id, threads) for c in configs}
        measured = {k: v for k, v in got.items() if v is not None}
        if len(measured) == len(got):  # every configuration measured
            return prof, f"measured profile {prof.name}", measured
    return prof, f"profile {prof.name} (MACs estimate)", {
        c.id: prof.estimate_ms(c.macs, c.invokes, threads, c.weights) for c in configs}


def sdk_overhead_ms(model: EdgeModel, repeats: int = 15) -> dict[str, float]:
    """The SDK's own time per call outside the interpreter (input checks, normalisation,
    the answer's maths), measured here on this host, so an unmeasured configuration's
    end-to-end prior is its invoke prior plus this. Keyed by the answer's shape."""
    lo, hi = model.manifest.input.value_range
    x = np.full(model._inputs.want, (lo + hi) / 2,
                np.uint8 if model.manifest.input.dtype == "uint8" else np.float32)
    by_shape: dict[tuple[int, int, bool], float] = {}
    out = {}
    for c in model.manifest.configurations:
        rows = 1 if c.scope == "point" else c.samples
        graph = c.files[0].name in model._answerable  # edge_sdk.answers.graph
        shape = (rows, c.invokes, graph)
        if shape not in by_shape:
            logits = np.zeros((rows, model._classes), np.float32)
            p = np.full((1, model._classes), 1 / model._classes, np.float32)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model._inputs.feed(x)
                if model._suspect is not None:
                    model._suspect.one(x)
                top = (answer_top(c, p, logits if c.scope == "head" else None) if graph
                       else lean_top(c, logits))
                if model._unc is None and top is not None:  # _execute_one's lean answer
                    lp, lab, conf, lz = top
                    lean_answer(c, model._labels, lab, conf, lz, False, 0.0, 0.0, True, None,
                                lp)
                else:
                    pr, h, mi, lab, conf = probabilities(c, logits) if top is None \
                        else eager_fields(top)
                    # the score and the set: their own cost
                    model._uncertain(c, pr, [], c.id, None, probe=True)
                    answer(c, model._labels, pr, h, mi, lab, conf, False, 0.0, 0.0, True)
                times.append(time.perf_counter() - t0)
            by_shape[shape] = statistics.median(times) * 1e3
        out[c.id] = by_shape[shape]
    return out


def uncertainty_widths(model: EdgeModel) -> dict[str, str]:
    """config id -> width key of its OOD statistics: the point and head configurations
    (the head scope runs the point backbone); BundleError when the file lacks a width or a
    configuration the manifest has."""
    entry = model.manifest.uncertainty
    if model._unc is None or entry is None:  # (the statistics come from that entry)
        return {}
    out = {}
    where = f"{model.bundle_dir}: {entry.name}"
    for c in model.manifest.configurations:
        if c.id not in model._unc.quantiles:
            raise BundleError(f"{where}: no conformal quantiles for configuration "
                              f"{c.id!r} (the file belongs to another export)")
        if c.scope in ("point", "head"):
            wk = width_key(c.width)
            if wk not in model._unc.widths:
                raise BundleError(f"{where}: no OOD statistics for width {wk} "
                                  f"(configuration {c.id!r})")
            out[c.id] = wk
    return out
