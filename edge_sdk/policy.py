"""Which configuration answers a call: the budget rule, stated once.

Among the configurations that fit both budgets, pick the lowest validation NLL in the manifest;
ties go to the larger width, then to fewer invokes. A configuration fits when its predicted
latency is within the latency budget and its memory need is within both the memory budget and
the memory available right now. Nothing fits: the cheapest configuration, flagged
``budget_met=False`` (or ``BudgetError`` in strict mode).

Predicted latency is an EWMA of latencies measured on this device once there are any, else the
manifest's host-measured latency (else a MACs-based estimate). Hysteresis: the configuration
chosen last keeps being chosen while its prediction stays within ``1 + hysteresis`` of the
budget, so a latency hovering at the budget does not flap between two widths.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from edge_sdk.bundle import Configuration
from edge_sdk.errors import BudgetError

# Used only when the manifest has no measured latency: a deliberately slow 1 GMAC/s CPU plus a
# fixed per-invoke overhead, so an unmeasured configuration is never optimistically preferred.
FALLBACK_GMACS = 1.0
FALLBACK_OVERHEAD_MS = 0.05


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


class Policy:
    """Selects configurations and learns their latency on this device."""

    def __init__(self, configs: Sequence[Configuration], memory: MemoryProbe,
                 ewma: float = 0.2, hysteresis: float = 0.1):
        if not configs:
            raise BudgetError("a bundle with no configurations cannot serve predictions")
        self.configs = list(configs)
        self.memory = memory
        self.ewma, self.hysteresis = ewma, hysteresis
        self._measured: dict[str, float] = {}
        self._last: str | None = None

    # ---- predictions about a configuration ------------------------------------------------
    def predicted_latency_ms(self, c: Configuration) -> float:
        if c.id in self._measured:
            return self._measured[c.id]
        if c.latency_ms is not None:
            return c.latency_ms
        return c.invokes * (c.macs / (FALLBACK_GMACS * 1e6) + FALLBACK_OVERHEAD_MS)

    def memory_need_mb(self, c: Configuration) -> float:
        if c.memory_mb is not None:
            return c.memory_mb
        return sum(f.bytes for f in c.files) * 4 / 2 ** 20  # DEQUANTIZE keeps an fp32 copy

    def observe(self, config_id: str, latency_ms: float) -> None:
        old = self._measured.get(config_id)
        self._measured[config_id] = latency_ms if old is None else \
            (1 - self.ewma) * old + self.ewma * latency_ms

    # ---- the rule --------------------------------------------------------------------------
    def fits(self, c: Configuration, budget: Budget, slack: float = 1.0) -> bool:
        if budget.latency_ms is not None and self.predicted_latency_ms(c) > budget.latency_ms * slack:
            return False
        need = self.memory_need_mb(c)
        if budget.memory_mb is not None and need > budget.memory_mb:
            return False
        return need <= self.memory.available_mb()

    @staticmethod
    def preference(c: Configuration) -> tuple:
        return (c.val_nll, -c.width, c.invokes)

    def cost(self, c: Configuration) -> tuple:
        return (self.predicted_latency_ms(c), self.memory_need_mb(c), c.invokes)

    def choose(self, budget: Budget, strict: bool = False,
               among: Sequence[Configuration] | None = None) -> tuple[Configuration, bool]:
        """(configuration, budget_met) for this call."""
        pool = list(among) if among is not None else self.configs
        feasible = [c for c in pool if self.fits(c, budget)]
        if self._last is not None:
            last = next((c for c in pool if c.id == self._last), None)
            # keep the previous choice while it is still within the hysteresis band and no
            # strictly better configuration fits
            if last is not None and self.fits(last, budget, 1 + self.hysteresis):
                best = min(feasible, key=self.preference) if feasible else None
                if best is None or self.preference(best) >= self.preference(last):
                    return last, True
        if feasible:
            choice = min(feasible, key=self.preference)
            self._last = choice.id
            return choice, True
        if strict:
            raise BudgetError(
                f"no configuration fits latency {budget.latency_ms} ms / memory "
                f"{budget.memory_mb} MB (available {self.memory.available_mb():.0f} MB); the "
                f"cheapest, {min(pool, key=self.cost).id}, needs "
                f"{self.predicted_latency_ms(min(pool, key=self.cost)):.3f} ms")
        return min(pool, key=self.cost), False
