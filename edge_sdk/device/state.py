"""One reading of the device, as the rules see it. Every field is ``None`` where the platform does
not report it (a desktop has no battery; many VMs have no temperature or clock sensor)."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeviceState", "FIELDS", "Signal"]

#: the readings, in the order explain() shows them
FIELDS = ("battery_percent", "plugged", "temperature_c", "clock_ratio", "available_mb")


@dataclass(frozen=True)
class DeviceState:
    """``at``: when it was read (the monitor's clock, seconds). ``battery_percent``: 0..100;
    ``plugged``: on mains power; ``temperature_c``: the hottest CPU sensor; ``clock_ratio``:
    current over maximum CPU clock (below 1: throttled or scaled down); ``available_mb``: the
    memory the system can give without swapping. ``simulated``: the fields an app injected
    instead of reading them (the demo's battery drain), so every table can label them."""

    at: float = 0.0
    battery_percent: float | None = None
    plugged: bool | None = None
    temperature_c: float | None = None
    clock_ratio: float | None = None
    available_mb: float | None = None
    simulated: frozenset[str] = field(default_factory=frozenset)

    def describe(self, name: str) -> str:
        """One reading as text, marked ``(simulated)`` when injected."""
        v = getattr(self, name)
        mark = " (simulated)" if name in self.simulated else ""
        if v is None:
            return f"{name.replace('_', ' ')} not reported"
        if name == "battery_percent":
            text = f"battery {v:.0f} %"
        elif name == "plugged":
            text = "plugged in" if v else "on battery"
        elif name == "temperature_c":
            text = f"CPU {v:.0f} °C"
        elif name == "clock_ratio":
            text = f"clock {v:.0%} of max"
        else:
            text = f"{v:.0f} MB available"
        return text + mark


class Signal:
    """A change counter the device monitor and the contention estimate share with the rules: a
    call compares one integer with the one it last saw instead of asking each source."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0
