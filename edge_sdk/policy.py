"""Which configuration answers a call: the budget rule, stated once.

Among the configurations that fit both budgets, pick the lowest validation NLL in the manifest;
ties go to the larger width, then to fewer invokes. A configuration fits when its predicted
latency is within the latency budget and its memory need is within both the memory budget and
the memory available right now. Nothing fits: the cheapest configuration, flagged
``budget_met=False`` (or ``BudgetError`` in strict mode).

Predicted latency is an EWMA of latencies measured on this device once there are any, else a
prior: the device profile's figure (a measured profile's latency table, or a published profile's
MACs-based estimate) when the runtime was given one, else the manifest's host-measured latency,
else a deliberately slow MACs-based fallback. A measurement ages: with no new observation its
weight halves every ``half_life_s`` seconds or every ``half_life_calls`` decisions, whichever
comes first, towards the prior, so a configuration measured slow during a
transient (another app, thermal throttling) is tried again later instead of being shunned for
good, and a fresh estimate clips a measurement at twice itself, so one preemption spike cannot
push a configuration out of its budget. Hysteresis: while the configuration chosen last still fits, a better one replaces it only
if it fits with ``hysteresis`` (10 %) headroom below the budget, so a latency hovering at the
budget does not flap between two widths, and nothing is kept once it no longer fits.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

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
                 ewma: float = 0.2, hysteresis: float = 0.1,
                 priors: Mapping[str, float] | None = None, half_life_s: float = 10.0,
                 half_life_calls: int = 200,
                 outlier: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.memory = memory
        # ageing in seconds covers an idle app; in decisions, a fast one (0.1 ms calls would
        # otherwise shun a configuration for 10 s after a burst). Retrying a configuration that
        # really is slow costs one late call per >= 1 half-life: <= 0.5 % of calls at 200.
        self.ewma, self.hysteresis, self.half_life_s = ewma, hysteresis, half_life_s
        self.half_life_calls = half_life_calls
        self._calls = 0  # decisions made (choose), the second clock measurements age by
        self.outlier = outlier
        self._priors = dict(priors or {})
        self._clock = clock
        # id -> (EWMA ms, when observed, decisions made by then)
        self._measured: dict[str, tuple[float, float, int]] = {}
        self._last: str | None = None
        self.configs = configs

    @property
    def configs(self) -> list[Configuration]:
        return self._configs

    @configs.setter
    def configs(self, configs: Sequence[Configuration]) -> None:
        if not configs:
            raise BudgetError("a bundle with no configurations cannot serve predictions")
        self._configs = list(configs)
        self._by_id = {c.id: c for c in self._configs}
        # the rule's order, computed once: the first configuration that fits is the choice
        self._ranked = sorted(self._configs, key=self.preference)
        self._need = {c.id: self.memory_need_mb(c) for c in self._configs}

    # ---- predictions about a configuration ------------------------------------------------
    def prior_latency_ms(self, c: Configuration) -> float:
        """What is believed before this device has measured ``c``."""
        if c.id in self._priors:
            return self._priors[c.id]
        if c.latency_ms is not None:
            return c.latency_ms
        return c.invokes * (c.macs / (FALLBACK_GMACS * 1e6) + FALLBACK_OVERHEAD_MS)

    def _predicted(self, c: Configuration, now: float) -> float:
        m = self._measured.get(c.id)
        if m is None:
            return self.prior_latency_ms(c)
        return self._blend(c, m[0], self._stale(m, now))

    def _blend(self, c: Configuration, measured: float, stale: float) -> float:
        if stale < 1e-3:
            return measured
        return (1 - stale) * measured + stale * self.prior_latency_ms(c)

    def predicted_latency_ms(self, c: Configuration) -> float:
        return self._predicted(c, self._clock())

    def _stale(self, m: tuple[float, float, int], now: float) -> float:
        """Weight of the prior: 0 for a fresh measurement, -> 1 as it ages."""
        age = max((now - m[1]) / self.half_life_s, (self._calls - m[2]) / self.half_life_calls)
        return 1.0 - 0.5 ** age

    @staticmethod
    def memory_need_mb(c: Configuration) -> float:
        if c.memory_mb is not None:
            return c.memory_mb
        return sum(f.bytes for f in c.files) * 4 / 2 ** 20  # DEQUANTIZE keeps an fp32 copy

    def observe(self, config_id: str, latency_ms: float) -> None:
        """Fold a measured latency into the configuration's EWMA. The older the previous
        estimate, the more the new measurement counts (a stale estimate is mostly prior)."""
        now = self._clock()
        old = self._measured.get(config_id)
        if old is None:
            new = latency_ms
        else:
            stale = self._stale(old, now)
            a = max(self.ewma, stale)
            pred = self._blend(self._by_id[config_id], old[0], stale)
            if stale <= self.ewma:
                # a fresh estimate moves at most `ewma` of the way to `outlier` x itself per
                # call: one preemption or GC pause (measured: 3-10x spikes at 0.1 ms) cannot
                # push a configuration out of its budget, while a sustained 2x slowdown is
                # still followed at the full EWMA rate
                latency_ms = min(latency_ms, self.outlier * pred)
            new = (1 - a) * pred + a * latency_ms
        self._measured[config_id] = (new, now, self._calls)

    # ---- the rule --------------------------------------------------------------------------
    def _fits(self, c: Configuration, latency: float | None, mem_limit: float, now: float,
              slack: float = 1.0) -> bool:
        need = self._need.get(c.id)
        if (self.memory_need_mb(c) if need is None else need) > mem_limit:
            return False
        return latency is None or self._predicted(c, now) <= latency * slack

    def _limit(self, budget: Budget) -> float:
        avail = self.memory.available_mb()
        return avail if budget.memory_mb is None else min(budget.memory_mb, avail)

    def fits(self, c: Configuration, budget: Budget, slack: float = 1.0) -> bool:
        return self._fits(c, budget.latency_ms, self._limit(budget), self._clock(), slack)

    @staticmethod
    def preference(c: Configuration) -> tuple:
        return (c.val_nll, -c.width, c.invokes)

    def cost(self, c: Configuration) -> tuple:
        return (self.predicted_latency_ms(c), self.memory_need_mb(c), c.invokes)

    def choose(self, budget: Budget, strict: bool = False,
               among: Sequence[Configuration] | None = None) -> tuple[Configuration, bool]:
        """(configuration, budget_met) for this call."""
        pool = self._ranked if among is None else sorted(among, key=self.preference)
        self._calls += 1
        now, limit, latency = self._clock(), self._limit(budget), budget.latency_ms
        best = next((c for c in pool if self._fits(c, latency, limit, now)), None)
        last = self._by_id.get(self._last) if self._last is not None else None
        if best is not None and last is not None and best.id != last.id and last in pool \
                and self._fits(last, latency, limit, now):
            # Hysteresis: the incumbent fits, and a better configuration replaces it only if
            # that one fits with `hysteresis` headroom; so a latency hovering at the budget
            # does not flap, and no configuration is ever kept beyond the budget.
            headroom, keep = 1 - self.hysteresis, self.preference(last)
            best = next((c for c in pool if c is last or (
                self.preference(c) < keep and self._fits(c, latency, limit, now, headroom))),
                last)
        if best is not None:
            self._last = best.id
            return best, True
        cheapest = min(pool, key=self.cost)
        if strict:
            raise BudgetError(
                f"no configuration fits latency {budget.latency_ms} ms / memory "
                f"{budget.memory_mb} MB (available {self.memory.available_mb():.0f} MB); the "
                f"cheapest, {cheapest.id}, needs {self.predicted_latency_ms(cheapest):.3f} ms")
        return cheapest, False
