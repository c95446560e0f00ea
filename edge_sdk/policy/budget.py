"""Budgets (per-call limits, always typed) and the probe of the memory available now."""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable

from edge_sdk.errors import BudgetError
from edge_sdk.validation import real_value


# Bounds of every budget-like number (10**400 raised a raw OverflowError): far above
# any real budget (a day; 1 TiB), low enough that sums and ratios of them stay finite.
MAX_LATENCY_MS = 86_400_000.0
MAX_MEMORY_MB = float(2 ** 20)


def bounded_number(v: object, what: str, maximum: float, unit: str,
                   error: type[Exception] = BudgetError) -> float:
    """``v`` as a float in (0, maximum], or ``error`` (a BudgetError for a budget, a
    ConfigError for a load() argument) in one line, never OverflowError. Python and numpy
    numbers alike (:func:`real_value`); bools and strings refused."""
    f = real_value(v)
    if f is not None and f > maximum:
        raise error(f"{what} must be at most {maximum:g} {unit}, got {_short(v)}")
    if f is None or math.isnan(f) or f <= 0:
        raise error(f"{what} must be a positive number of {unit} (at most {maximum:g}) or "
                    f"None, got {type(v).__name__} {_short(v)}")
    return f


def _short(v: object) -> str:
    if isinstance(v, int) and v.bit_length() > 64:
        return f"<an integer of {v.bit_length()} bits>"
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Budget:
    """Per-call limits; ``None`` means unconstrained."""

    latency_ms: float | None = None
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        for name, top, unit in (("latency_ms", MAX_LATENCY_MS, "ms"),
                                ("memory_mb", MAX_MEMORY_MB, "MB")):
            v = getattr(self, name)
            if v is None:
                continue
            # numpy scalars welcome (np.float32(2) is 2.0), stored as float
            object.__setattr__(self, name, bounded_number(v, f"Budget.{name}", top, unit))


def check_budget(value: object, what: str = "budget") -> Budget:
    """``value`` when it is a Budget; BudgetError otherwise (a bare number is ambiguous: 5 ms?
    5 MB? and 0 must never silently mean "no budget")."""
    if isinstance(value, Budget):
        return value
    hint = (f"; for a latency budget write edge_sdk.Budget(latency_ms={value!r})"
            if isinstance(value, numbers.Real) and not isinstance(value, bool) else "")
    raise BudgetError(f"{what} must be an edge_sdk.Budget (or None for the model's budget), got "
                      f"{type(value).__name__}{hint}")


class MemoryProbe:
    """Available system memory in MB, read at most every ``interval_s`` (never on every call).
    ``reader`` is injectable for tests; the default is ``psutil.virtual_memory().available``."""

    def __init__(self, reader: Callable[[], float] | None = None, interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        if reader is None:
            import psutil

            reader = lambda: psutil.virtual_memory().available / 2 ** 20  # noqa: E731
        self._reader: Callable[[], float] = reader
        self._interval, self._clock = interval_s, clock
        # read on the first call (now - -inf >= any interval), so never returned as NaN
        self._value, self._at = math.nan, -math.inf

    def available_mb(self) -> float:
        now = self._clock()
        if now - self._at >= self._interval:
            self._value, self._at = float(self._reader()), now
        return self._value

    def read(self) -> float:
        """Read now (the device monitor's timer does, so calls find a fresh value)."""
        self._value, self._at = float(self._reader()), self._clock()
        return self._value
