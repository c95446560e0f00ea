"""Measured device profiles: ``edge-sdk profile`` times every configuration of a bundle on this
host (:func:`measure_profile`) and fits the throughput line ``ms = invokes * (macs / gmacs +
overhead)`` through them (:func:`fit_throughput`); the result is cached per host and manifest
(:func:`cached_profile_path`), where ``load(..., profile="auto")`` finds it
(:func:`find_cached`). The profile format itself is :mod:`edge_sdk.policy.profiles`.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
from pathlib import Path
from typing import Any

from edge_sdk.errors import ProfileError
from edge_sdk.policy.profiles import ARCHES, DeviceProfile, Throughput, load_profile

__all__ = ["cache_dir", "cached_profile_path", "find_cached", "fit_throughput", "host_id",
           "manifest_sha256", "measure_profile"]


def host_id() -> str:
    """Stable name for this machine: hostname + architecture."""
    raw = f"{platform.node() or 'host'}-{platform.machine() or 'cpu'}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def manifest_sha256(bundle_dir: str | os.PathLike[str]) -> str:
    from edge_sdk.bundle.records import MANIFEST_NAME

    return hashlib.sha256((Path(bundle_dir) / MANIFEST_NAME).read_bytes()).hexdigest()


def cache_dir() -> Path:
    env = os.environ.get("EDGE_SDK_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
        / "edge_sdk"
    return base / "profiles"


def cached_profile_path(bundle_dir: str | os.PathLike[str], sha: str | None = None) -> Path:
    """Where ``edge-sdk profile`` caches the measured profile of this bundle on this host
    (``sha``: the manifest's sha256, when the caller has it already)."""
    sha = sha or manifest_sha256(bundle_dir)
    return cache_dir() / f"{host_id()}-{sha[:16]}.yaml"


def find_cached(bundle_dir: str | os.PathLike[str], sha: str | None = None) -> DeviceProfile | None:
    """The cached measured profile for this bundle and host; one for a different manifest
    (the bundle was re-exported) is ignored."""
    sha = sha or manifest_sha256(bundle_dir)
    p = cached_profile_path(bundle_dir, sha)
    if not p.is_file():
        return None
    prof = load_profile(p)
    return prof if prof.bundle_sha256 == sha else None


def fit_throughput(macs: list[float], ms: list[float]) -> Throughput:
    """Least-squares ``ms = overhead + macs / (gmacs * 1e6)`` over a bundle's slices. With a
    single distinct size (or a fit giving a negative intercept) the overhead is 0 and gmacs
    is the mean rate, so the estimate is never optimistic for the slices measured."""
    x = [float(m) for m in macs]
    if len(set(x)) >= 2:
        n = len(x)
        mx, my = sum(x) / n, sum(ms) / n
        slope = sum((a - mx) * (b - my) for a, b in zip(x, ms)) / sum((a - mx) ** 2 for a in x)
        intercept = my - slope * mx
        if slope > 0 and intercept >= 0:
            return Throughput(gmacs=1.0 / (slope * 1e6), overhead_ms=intercept)
    rate = sum(x) / (sum(ms) * 1e6)  # GMAC/s over everything measured
    return Throughput(gmacs=rate, overhead_ms=0.0)


def _host() -> dict[str, Any]:
    import psutil

    machine = platform.machine().lower()
    arch = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "x86_64", "amd64": "x86_64"}.get(machine)
    if arch is None:
        raise ProfileError(f"cannot profile this host: architecture {machine!r} is not one of "
                           f"{', '.join(ARCHES)}")
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    freq = psutil.cpu_freq()
    clock = round(freq.max / 1000, 3) if freq is not None and freq.max else None
    return {"model": model or machine, "cores": os.cpu_count() or 1, "max_clock_ghz": clock,
            "arch": arch, "ram_mb": int(psutil.virtual_memory().total // 2 ** 20)}


def measure_profile(bundle_dir: str | os.PathLike[str], threads: list[int] | None = None,
                    repeats: int = 50, name: str | None = None, backend: str | None = None
                    ) -> tuple[DeviceProfile, list[dict[str, Any]]]:
    """Measure this host through the real interpreter on the bundle's own slices.

    Every file is invoked ``repeats`` times (after warm-up) per thread count; a configuration's
    latency is the sum of its files' medians. Effective GMAC/s and per-invoke overhead come
    from a least-squares fit over the single-invoke configurations, per route (DEQUANTIZE and
    float slices -> fp32, hybrid -> int8). Returns the profile and one row per (threads,
    configuration) with the measured and the fitted latency, so the fit can be judged. A store
    bundle's slices are materialised one at a time from its verified store (each checked
    against its sha256, as load() does), so at most one is held in memory."""
    import statistics
    import time

    import numpy as np

    from edge_sdk.backends import check_bundle, interpreter_class
    from edge_sdk.bundle.reading import read_manifest
    from edge_sdk.store.sources import open_slices

    if repeats < 1:
        raise ProfileError(f"repeats must be >= 1, got {repeats}")
    manifest = read_manifest(bundle_dir, verify=True)
    host = _host()
    threads = sorted(set(threads or [1, host["cores"]]))
    bad = [t for t in threads if not 1 <= t <= host["cores"]]
    if bad:
        raise ProfileError(f"thread counts must be between 1 and this host's {host['cores']} "
                           f"cores, got {bad}")
    cls, backend = interpreter_class(backend)  # as load(): argument, EDGE_SDK_BACKEND, auto
    slices = open_slices(bundle_dir, manifest, memory_cap_mb=0)  # verified bytes only
    checked, stand_ins = slices.load_check()
    left_out = check_bundle(bundle_dir, manifest, backend, checked, None, stand_ins)
    del checked
    configs = [c for c in manifest.configurations if c.id not in left_out]  # runnable here
    wanted = {f.name for c in configs for f in c.files}
    spec = manifest.input
    x = np.random.default_rng(0).standard_normal(spec.shape).astype(np.float32)
    # a profile's routes: float32 kernels, or int8 ones (dynamic-range and integer slices)
    routes = {"dequantize": "fp32", "float": "fp32", "hybrid": "int8", "int8": "int8"}
    throughput: dict[str, dict[int, Throughput]] = {}
    latency: dict[int, dict[str, float]] = {}
    per_file: dict[int, dict[str, float]] = {t: {} for t in threads}
    for file_name in slices.names():  # each slice once (a store bundle: materialised once)
        if file_name not in wanted:
            continue
        data = slices[file_name]
        for t in threads:
            it = cls(model_content=data, num_threads=t, model_name=file_name)
            it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], x)
            for _ in range(3):
                it.invoke()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                it.invoke()
                times.append(time.perf_counter() - t0)
            per_file[t][file_name] = statistics.median(times) * 1e3
            del it
    for t in threads:
        latency[t] = {c.id: sum(per_file[t][f.name] for f in c.files) for c in configs}
        for route in ("fp32", "int8"):
            single = [c for c in configs if routes[c.weights] == route and c.invokes == 1]
            if single:
                throughput.setdefault(route, {})[t] = fit_throughput(
                    [c.macs for c in single], [latency[t][c.id] for c in single])
    if "fp32" not in throughput:  # a hybrid-only bundle: its int8 figures are all we know
        throughput["fp32"] = dict(throughput["int8"])
    profile = DeviceProfile(
        name=name or host_id(), cpu_model=host["model"], cores=host["cores"],
        description=f"measured by edge-sdk profile on {host_id()} ({backend}, {repeats} "
                    f"repeats per slice)",
        max_clock_ghz=host["max_clock_ghz"], arch=host["arch"], ram_mb=host["ram_mb"],
        throughput=throughput, measured=True, sources=(f"edge-sdk profile {Path(bundle_dir)}",),
        bundle_sha256=manifest_sha256(bundle_dir), latency_ms=latency)
    rows = [{"threads": t, "config": c.id, "macs": c.macs, "invokes": c.invokes,
             "measured_ms": latency[t][c.id],
             "fitted_ms": profile.estimate_ms(c.macs, c.invokes, t, c.weights)}
            for t in threads for c in configs]
    return profile, rows
