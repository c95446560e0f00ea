"""Device profiles: how fast a device class runs a slice, before this device has measured it.

A profile (``device_profiles/<name>.yaml`` in the repository, shipped inside the device wheel as
``edge_sdk/device_profiles/``; schema version 1) states the device's cores, clock and
RAM, and an effective throughput per route and thread count: ``gmacs`` (GMAC/s sustained on a
CNN) and ``overhead_ms`` (fixed cost per ``invoke``). The runtime's latency estimate for a
configuration is then ``invokes * (macs / (gmacs * 1e6) + overhead_ms)``. Built-in profiles carry
published figures with a source comment on every number; ``edge-sdk profile`` writes a
*measured* profile for this host and bundle, which also holds the per-configuration latencies
it measured (``bundle.latency_ms``), and which ``load(..., profile="auto")`` finds in the cache.

Routes: ``dequantize`` and ``float`` slices run fp32 kernels (DEQUANTIZE expands int8 weights to
fp32 once, at allocation), so they use ``fp32``; ``hybrid`` slices use ``int8`` when the profile
has it, else ``fp32``.

stdlib + pyyaml only (device side).
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from edge_sdk.validation import bool_value, choice, fail, float_value, int_value, mapping
from edge_sdk.errors import BundleError, ProfileError

SCHEMA_VERSION = 1
# the safe loader (plain data, never an object) on libyaml's parser when PyYAML has it
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ARCHES = ("arm64", "x86_64")
ROUTES = ("fp32", "int8")


def _builtin_dir() -> Path:
    """The built-in profiles: package data in an installed wheel (``edge_sdk/device_profiles/``,
    where pyproject.toml puts the repository's ``device_profiles/``), else that top-level
    directory of a source checkout (editable installs, ``PYTHONPATH=.``)."""
    packaged = resources.files("edge_sdk").joinpath("device_profiles")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "device_profiles"


BUILTIN_DIR = _builtin_dir()
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Throughput:
    gmacs: float  # effective GMAC/s on a CNN at this thread count
    overhead_ms: float  # fixed cost of one invoke (dispatch, small-op tail)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    cpu_model: str
    cores: int
    max_clock_ghz: float | None  # None: a measured host that does not report it
    arch: str
    ram_mb: int
    throughput: Mapping[str, Mapping[int, Throughput]]  # route -> threads -> figures
    measured: bool = False
    sources: tuple[str, ...] = ()
    # measured profiles only: which bundle, and its configurations' latency per thread count
    bundle_sha256: str | None = None
    latency_ms: Mapping[int, Mapping[str, float]] = field(default_factory=dict)

    def figures(self, threads: int | None, weights: str = "dequantize") -> Throughput:
        """The throughput entry at ``threads`` (the largest listed thread count not above it;
        ``None`` = all cores; below the smallest listed count, the smallest)."""
        want = self.cores if threads is None else threads
        int8 = self.throughput.get("int8", {})
        # hybrid slices use int8 figures only where one exists at or below this thread count:
        # a published all-cores int8 figure says nothing about one thread
        route = "int8" if weights == "hybrid" and any(t <= want for t in int8) else "fp32"
        table = self.throughput[route]
        usable = [t for t in table if t <= want]
        return table[max(usable) if usable else min(table)]

    def estimate_ms(self, macs: int, invokes: int = 1, threads: int | None = None,
                    weights: str = "dequantize") -> float:
        f = self.figures(threads, weights)
        return invokes * (macs / (f.gmacs * 1e6) + f.overhead_ms)

    def measured_latency_ms(self, config_id: str, threads: int | None) -> float | None:
        """This host's measured latency of a configuration at ``threads`` (exact thread count,
        or for ``None`` the largest measured), when the profile has one."""
        if not self.latency_ms:
            return None
        key = max(self.latency_ms) if threads is None else threads
        return self.latency_ms.get(key, {}).get(config_id)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "name": self.name, "description": self.description,
            "cpu": {"model": self.cpu_model, "cores": self.cores,
                    "max_clock_ghz": self.max_clock_ghz, "arch": self.arch},
            "ram_mb": self.ram_mb,
            "throughput": {r: {str(t): {"gmacs": f.gmacs, "overhead_ms": f.overhead_ms}
                               for t, f in sorted(tab.items())}
                           for r, tab in self.throughput.items()},
            "measured": self.measured, "sources": list(self.sources)}
        if self.bundle_sha256 is not None:
            d["bundle"] = {"manifest_sha256": self.bundle_sha256,
                           "latency_ms": {str(t): dict(v) for t, v in sorted(self.latency_ms.items())}}
        return d


# ---------------------------------------------------------------- validation (schema version 1)


# The bundle schema's validators, reused: they raise BundleError naming the dotted key path,
# which profile_from_dict turns into ProfileError at its boundary.


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        fail(where, f"missing key {key!r}")
    return d[key]


def _thread_key(k: object, where: str, cores: int) -> int:
    try:
        t = int(str(k))
    except ValueError:
        fail(where, f"thread count keys must be integers, got {k!r}")
    if not 1 <= t <= cores:
        fail(where, f"thread count {t} must be between 1 and cpu.cores ({cores})")
    return t


def profile_from_dict(d: object, where: str = "profile") -> DeviceProfile:
    try:
        return _profile_from_dict(d, where)
    except BundleError as e:
        raise ProfileError(str(e)) from None


def _profile_from_dict(data: object, where: str) -> DeviceProfile:
    d = mapping(data, where)
    unknown = set(d) - {"schema_version", "name", "description", "cpu", "ram_mb", "throughput",
                        "measured", "sources", "bundle", "host"}
    if unknown:
        fail(where, f"unknown keys {sorted(unknown)}")
    version = _get(d, "schema_version", where)
    if version != SCHEMA_VERSION:
        fail(f"{where}.schema_version", f"this runtime reads version {SCHEMA_VERSION}, got "
                                         f"{version!r}")
    name = _get(d, "name", where)
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        fail(f"{where}.name", f"expected a name of letters, digits, '_', '-', '.', got {name!r}")
    desc = d.get("description", "")
    cpu = mapping(_get(d, "cpu", where), f"{where}.cpu")
    cores = int_value(_get(cpu, "cores", f"{where}.cpu"), f"{where}.cpu.cores", minimum=1)
    clock = _get(cpu, "max_clock_ghz", f"{where}.cpu")
    if clock is not None or d.get("measured") is not True:  # a host may not report its clock
        clock = float_value(clock, f"{where}.cpu.max_clock_ghz", gt=0.0)
    arch = choice(_get(cpu, "arch", f"{where}.cpu"), f"{where}.cpu.arch", ARCHES)
    ram = int_value(_get(d, "ram_mb", where), f"{where}.ram_mb", minimum=1)
    tp = mapping(_get(d, "throughput", where), f"{where}.throughput")
    if "fp32" not in tp:
        fail(f"{where}.throughput", "missing key 'fp32' (every profile needs fp32 figures)")
    routes: dict[str, dict[int, Throughput]] = {}
    for route, table in tp.items():
        w = f"{where}.throughput.{route}"
        if route not in ROUTES:
            fail(w, f"unknown route; expected one of {', '.join(ROUTES)}")
        table = mapping(table, w)
        if not table:
            fail(w, "expected at least one thread count")
        routes[route] = {}
        for k, entry in table.items():
            t = _thread_key(k, w, cores)
            e = mapping(entry, f"{w}.{k}")
            routes[route][t] = Throughput(
                float_value(_get(e, "gmacs", f"{w}.{k}"), f"{w}.{k}.gmacs", gt=0.0),
                float_value(_get(e, "overhead_ms", f"{w}.{k}"), f"{w}.{k}.overhead_ms", ge=0.0))
    measured = bool_value(d.get("measured", False), f"{where}.measured")
    sources = d.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        fail(f"{where}.sources", "expected a list of strings")
    if not measured and not sources:
        fail(f"{where}.sources", "a published profile must cite its sources")
    sha, lat = None, {}
    if "bundle" in d:
        b = mapping(d["bundle"], f"{where}.bundle")
        sha = _get(b, "manifest_sha256", f"{where}.bundle")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            fail(f"{where}.bundle.manifest_sha256", f"expected 64 hex characters, got {sha!r}")
        for k, row in mapping(_get(b, "latency_ms", f"{where}.bundle"),
                               f"{where}.bundle.latency_ms").items():
            w = f"{where}.bundle.latency_ms.{k}"
            lat[_thread_key(k, w, cores)] = {
                str(cid): float_value(ms, f"{w}.{cid}", gt=0.0) for cid, ms in mapping(row, w).items()}
    return DeviceProfile(name=name, description=str(desc), cpu_model=str(cpu.get("model", "")),
                         cores=cores, max_clock_ghz=clock, arch=arch, ram_mb=ram,
                         throughput=routes, measured=measured, sources=tuple(sources),
                         bundle_sha256=sha, latency_ms=lat)


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_profile(spec: str | os.PathLike[str]) -> DeviceProfile:
    """A built-in profile by name (``raspberry_pi_4``) or a YAML file by path."""
    p = Path(spec)
    if p.suffix not in (".yaml", ".yml"):
        p = BUILTIN_DIR / f"{spec}.yaml"
        if not p.is_file():
            raise ProfileError(f"no built-in device profile {str(spec)!r}; built-in: "
                               f"{', '.join(builtin_profiles()) or 'none'} (or pass a .yaml path)")
    if not p.is_file():
        raise ProfileError(f"device profile {p} does not exist")
    from edge_sdk.bundle.reading import _check_events

    try:
        text = p.read_text(encoding="utf-8")
        # the manifest's event checks (issue 36): no aliases, no duplicate key, bounded nesting
        _check_events(text, str(p))
        data = yaml.load(text, Loader=SAFE_LOADER)
    except BundleError as e:
        raise ProfileError(str(e)) from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError, OSError) as e:
        # one line: PyYAML's messages span 2-4 (context, mark, problem, mark)
        raise ProfileError(f"{p}: not valid YAML ({' '.join(str(e).split())[:300]})") from None
    return profile_from_dict(data, str(p))


# ---------------------------------------------------------------- measured profiles and the cache


def host_id() -> str:
    """Stable name for this machine: hostname + architecture."""
    raw = f"{platform.node() or 'host'}-{platform.machine() or 'cpu'}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def manifest_sha256(bundle_dir: str | os.PathLike[str]) -> str:
    from edge_sdk.bundle import MANIFEST_NAME

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


def write_profile(profile: DeviceProfile, path: str | os.PathLike[str], header: str = "") -> Path:
    """Write atomically (temp file in the same directory, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = header + yaml.safe_dump(profile.to_dict(), sort_keys=False)
    # never write what we could not read back
    profile_from_dict(yaml.load(text, Loader=SAFE_LOADER), str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


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
    from edge_sdk.bundle import read_manifest
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
    check_bundle(bundle_dir, manifest, backend, checked, None, stand_ins)
    del checked
    spec = manifest.input
    x = np.random.default_rng(0).standard_normal(spec.shape).astype(np.float32)
    routes = {"dequantize": "fp32", "float": "fp32", "hybrid": "int8"}
    throughput: dict[str, dict[int, Throughput]] = {}
    latency: dict[int, dict[str, float]] = {}
    per_file: dict[int, dict[str, float]] = {t: {} for t in threads}
    for file_name in slices.names():  # each slice once (a store bundle: materialised once)
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
        latency[t] = {c.id: sum(per_file[t][f.name] for f in c.files)
                      for c in manifest.configurations}
        for route in ("fp32", "int8"):
            single = [c for c in manifest.configurations
                      if routes[c.weights] == route and c.invokes == 1]
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
            for t in threads for c in manifest.configurations]
    return profile, rows
