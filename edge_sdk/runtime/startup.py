"""What :func:`edge_sdk.load` works out once, before the first call:
its arguments typed before the bundle is read, the interpreter latency the policy believes of
each configuration until this process has measured it (a device profile or the manifest), the
SDK's own time per call outside the interpreter measured on this host (so an unmeasured
configuration's end-to-end prior is its invoke prior plus that), and which
width's OOD statistics each configuration reads.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from edge_sdk.backends import BACKENDS, BackendError, resolve_name
from edge_sdk.policy.budget import MAX_MEMORY_MB, bounded_number
from edge_sdk.bundle.records import width_key
from edge_sdk.answers.conformal import METHODS as CONFORMAL_METHODS
from edge_sdk.errors import BundleError, ConfigError, ProfileError
from edge_sdk.policy.plan import MODES
from edge_sdk.policy.measured import find_cached, manifest_sha256
from edge_sdk.policy.profiles import DeviceProfile, load_profile
from edge_sdk.validation import real_value, show

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.answers.uncertainty import Uncertainty
    from edge_sdk.bundle.manifest import Manifest

__all__ = ["MAX_THREADS", "answerable", "check_load_args", "latency_priors",
           "uncertainty_widths"]

MAX_THREADS = 1024  # far above any device's cores; LiteRT takes an int32 and overflows above


def check_load_args(bundle_dir: object, profile: object, threads: object, policy: object,
                    target_accuracy: object, strict: object, memory_cap_mb: object, *,
                    uncertainty: object = True, abstain_on_ood: object = True,
                    input_check: object = True, conformal: object = "lac",
                    backend: object = None, memory_reader: object = None,
                    clock: object = None) -> tuple[float, float | None, int | None]:
    """load()'s arguments, typed before the bundle is read: ``(target_accuracy,
    memory_cap_mb, threads)`` as plain Python numbers.

    One error type per argument, whatever is wrong with its value: a ConfigError naming the
    argument (``profile``: a ProfileError, itself a ConfigError). A caller catches one type
    per mistake, not one per way of making it (``target_accuracy=0.5``, a target the bundle
    has no threshold for, was a BudgetError and ``'0.95'`` a ConfigError). Numbers may be
    Python's or numpy's (``np.float64(0.95)``, ``np.int64(50)``), never bools."""
    if not isinstance(bundle_dir, (str, os.PathLike)):
        raise ConfigError(f"bundle_dir must be the bundle's directory (a str or a path), got "
                          f"{type(bundle_dir).__name__} {show(bundle_dir)}")
    for name, v in (("strict", strict), ("uncertainty", uncertainty),
                    ("abstain_on_ood", abstain_on_ood), ("input_check", input_check)):
        if not isinstance(v, bool):
            raise ConfigError(f"{name} must be True or False, got {show(v)}")
    if not isinstance(conformal, str) or conformal not in CONFORMAL_METHODS:
        raise ConfigError(f"conformal must be one of {', '.join(CONFORMAL_METHODS)} (the "
                          f"prediction sets' score), got {show(conformal)}")
    if profile is not None and not isinstance(profile, (str, os.PathLike)):
        raise ProfileError(f"profile must be 'auto', a built-in profile name, a YAML path or "
                           f"None, got {type(profile).__name__} {show(profile)}")
    n_threads = None
    if threads is not None:
        # an integer of Python or numpy (np.int64(2)); 2.0 is refused as a float, as a bool is
        n_threads = 0
        if isinstance(threads, (int, np.integer)) and not isinstance(threads, bool):
            n_threads = int(threads)
        if not 1 <= n_threads <= MAX_THREADS:
            raise ConfigError(f"threads must be an integer in [1, {MAX_THREADS}] or None (the "
                              f"runtime's default), got {show(threads)}")
    if not isinstance(policy, str) or policy not in MODES:
        raise ConfigError(f"policy must be one of {', '.join(MODES)}, got {show(policy)}")
    target = real_value(target_accuracy)
    if target is None or not 0 < target <= 1:  # (NaN fails the comparison)
        raise ConfigError(f"target_accuracy must be a number in (0, 1], got "
                          f"{show(target_accuracy)}")
    cap = None if memory_cap_mb is None else bounded_number(  # 10**400: typed, not Overflow
        memory_cap_mb, "memory_cap_mb", MAX_MEMORY_MB, "MB", ConfigError)
    if backend is not None:  # the value; whether that backend is installed is a BackendError
        if not isinstance(backend, str):
            raise ConfigError(f"backend must be a string (auto, {', '.join(BACKENDS)}) or None, "
                              f"got {type(backend).__name__} {show(backend)}")
        try:
            resolve_name(backend)
        except BackendError as e:  # an unknown name: the one line that names the choices
            raise ConfigError(str(e)) from None
    for name, fn in (("memory_reader", memory_reader), ("clock", clock)):
        if fn is not None and not callable(fn):
            raise ConfigError(f"{name} must be a function of no arguments (or None), got "
                              f"{type(fn).__name__} {show(fn)}")
    return target, cap, n_threads


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


def uncertainty_widths(manifest: Manifest, unc: Uncertainty | None, bundle_dir: Path
                       ) -> dict[str, str]:
    """config id -> width key of its OOD statistics: the point and head configurations
    (the head scope runs the point backbone); BundleError when the file lacks a width or a
    configuration the manifest has."""
    entry = manifest.uncertainty
    if unc is None or entry is None:  # (the statistics come from that entry)
        return {}
    out = {}
    where = f"{bundle_dir}: {entry.name}"
    for c in manifest.configurations:
        if c.id not in unc.quantiles:
            raise BundleError(f"{where}: no conformal quantiles for configuration "
                              f"{c.id!r} (the file belongs to another export)")
        if c.scope in ("point", "head"):
            wk = width_key(c.width)
            if wk not in unc.widths:
                raise BundleError(f"{where}: no OOD statistics for width {wk} "
                                  f"(configuration {c.id!r})")
            out[c.id] = wk
    return out


def answerable(configs: Sequence[Configuration]) -> dict[str, Configuration]:
    """File name -> the configuration whose answer (the tempered softmax) its runtime graph
    computes (edge_sdk.answers.graph): the point and head slices no other configuration
    lists (an all-scope sample file serves several S, each with its own temperature)."""
    users: dict[str, int] = {}
    for c in configs:
        for f in c.files:
            users[f.name] = users.get(f.name, 0) + 1
    return {c.files[0].name: c for c in configs
            if c.scope in ("point", "head") and len(c.files) == 1 and users[c.files[0].name] == 1}
