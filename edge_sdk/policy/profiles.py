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

import os
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
        # dynamic-range and integer slices use int8 figures only where one exists at or below
        # this thread count:
        # a published all-cores int8 figure says nothing about one thread
        route = "int8" if weights in ("hybrid", "int8") and any(t <= want for t in int8) \
            else "fp32"
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
        # the manifest's event checks: no aliases, no duplicate key, bounded nesting
        _check_events(text, str(p))
        data = yaml.load(text, Loader=SAFE_LOADER)
    except BundleError as e:
        raise ProfileError(str(e)) from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError, OSError) as e:
        # one line: PyYAML's messages span 2-4 (context, mark, problem, mark)
        raise ProfileError(f"{p}: not valid YAML ({' '.join(str(e).split())[:300]})") from None
    return profile_from_dict(data, str(p))


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
