"""Readers of the device state: each a plain function that returns its reading, or ``None``
where the platform does not report it. The defaults use psutil (battery, temperatures, clock,
memory); contention is measured from the runtime's own calls (:mod:`.contention`). An app or a
test passes its own callables in :class:`Readers` (the demo's battery drain is one); the
readers it injects are listed in ``simulated`` so every table labels them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Readers", "battery", "clock_ratio", "memory_mb", "temperature"]


def battery() -> tuple[float, bool | None] | None:
    """(percent, plugged in), or None without a battery."""
    import psutil

    b = getattr(psutil, "sensors_battery", lambda: None)()
    if b is None:
        return None
    return float(b.percent), b.power_plugged


def temperature() -> float | None:
    """The hottest CPU-ish sensor in °C (coretemp, k10temp, cpu_thermal, soc, ...), else the
    hottest of any; None when nothing is reported (psutil has no sensors on macOS/Windows)."""
    import psutil

    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None
    try:
        temps = read()
    except (OSError, RuntimeError):  # a broken hwmon node must not take the app down
        return None
    cpu = [t.current for name, ts in temps.items() for t in ts
           if any(k in name.lower() for k in ("core", "k10", "cpu", "soc", "package"))]
    every = cpu or [t.current for ts in temps.values() for t in ts]
    return max(every) if every else None


def clock_ratio() -> float | None:
    """Current over maximum CPU clock, averaged over the cores; None when the maximum is not
    reported (psutil gives max 0 in many VMs)."""
    import psutil

    try:
        f = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError):
        return None
    if f is None or not f.max or f.max <= 0:
        return None
    return float(f.current) / float(f.max)


def memory_mb() -> float | None:
    """Memory available without swapping, in MB."""
    import psutil

    return float(psutil.virtual_memory().available) / 2 ** 20


@dataclass(frozen=True)
class Readers:
    """The callables the monitor reads (None: that reading is off). ``simulated``: the names of
    readings that are injected stand-ins (``"battery_percent"``, ``"plugged"``,
    ``"temperature_c"``, ``"clock_ratio"``, ``"available_mb"``), labelled in every table."""

    battery: Callable[[], tuple[float, bool | None] | None] | None = battery
    temperature: Callable[[], float | None] | None = temperature
    clock: Callable[[], float | None] | None = clock_ratio
    memory: Callable[[], float | None] | None = memory_mb
    simulated: frozenset[str] = field(default_factory=frozenset)
