"""Budgets (per-call limits, always typed) and the probe of the memory available now."""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from edge_sdk.errors import BudgetError


@dataclass(frozen=True)
class Budget:
    """Per-call limits; ``None`` means unconstrained."""

    latency_ms: float | None = None
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_ms", "memory_mb"):
            v = getattr(self, name)
            if v is None:
                continue
            if (isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)
                    or math.isnan(v) or v <= 0):
                raise BudgetError(f"Budget.{name} must be a positive number or None, got {v!r}")
            object.__setattr__(self, name, float(v))  # numpy scalars welcome, stored as float


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
        self._reader, self._interval, self._clock = reader, interval_s, clock
        self._value, self._at = None, -math.inf

    def available_mb(self) -> float:
        now = self._clock()
        if now - self._at >= self._interval:
            self._value, self._at = float(self._reader()), now
        return self._value
