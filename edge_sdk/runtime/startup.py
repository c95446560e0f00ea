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


from edge_sdk.policy.budget import MAX_MEMORY_MB, bounded_number
from edge_sdk.bundle.records import width_key
from edge_sdk.answers.conformal import METHODS as CONFORMAL_METHODS
from edge_sdk.errors import BundleError, ConfigError, ProfileError
from edge_sdk.policy.plan import MODES
from edge_sdk.policy.measured import find_cached, manifest_sha256
from edge_sdk.policy.profiles import DeviceProfile, load_profile
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.answers.uncertainty import Uncertainty
    from edge_sdk.bundle.manifest import Manifest

__all__ = ["MAX_THREADS", "answerable", "check_load_args", "latency_priors",
           "uncertainty_widths"]

MAX_THREADS = 1024  # far above any device's cores; LiteRT takes an int32 and overflows above


def check_load_args(profile: object, threads: object, policy: object, target_accuracy: object,
                    strict: object, memory_cap_mb: object, *, uncertainty: object = True,
                    abstain_on_ood: object = True, input_check: object = True,
                    conformal: object = "lac") -> None:
    """load()'s arguments, typed before the bundle is read."""
    for name, v in (("uncertainty", uncertainty), ("abstain_on_ood", abstain_on_ood),
                    ("input_check", input_check)):
        if not isinstance(v, bool):
            raise ConfigError(f"{name} must be True or False, got {show(v)}")
    if not isinstance(conformal, str) or conformal not in CONFORMAL_METHODS:
        raise ConfigError(f"conformal must be one of {', '.join(CONFORMAL_METHODS)} (the "
                          f"prediction sets' score), got {show(conformal)}")
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
    if memory_cap_mb is not None:  # bounded: 10**400 raised a raw OverflowError
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
