"""What the policy believes a configuration costs (a mixin of
:class:`edge_sdk.policy.policy.Policy`, which sets the attributes declared below): its end-to-end
latency, a prior until this device has measured it and then an EWMA of the measurements that
ages back toward the prior (every ``half_life_s`` seconds or ``half_life_calls`` decisions,
whichever comes first), and its memory need. The rule that compares them with a budget, and
the plan, are in policy.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.device.contention import Contention

__all__ = ["FALLBACK_GMACS", "FALLBACK_OVERHEAD_MS", "Estimates"]

# Used only when the manifest has no measured latency: a deliberately slow 1 GMAC/s CPU plus a
# fixed per-invoke overhead, so an unmeasured configuration is never optimistically preferred.
FALLBACK_GMACS = 1.0
FALLBACK_OVERHEAD_MS = 0.05


class Estimates:
    # What Policy sets (declared for the checker; no class attributes at run time).
    ewma: float
    outlier: float
    half_life_s: float
    half_life_calls: float
    prior_source: str
    _priors: dict[str, float]
    _overhead: Mapping[str, float]
    _clock: Callable[[], float]
    _calls: int
    _fresh_s: float
    _one_call_age: float
    _one_call_stale: float
    _measured: dict[str | tuple[str, int], tuple[float, float, int]]
    _by_id: dict[str, Configuration]
    _need: dict[str, float]
    _prior_e2e: dict[str, float]
    _floor: dict[str, float]
    _candidates: tuple[float | None, float, list[Configuration]] | None
    _group: dict[str, tuple[Configuration, ...]]
    _last2: dict[str | tuple[str, int], tuple[float, float]]
    _batch_ratio: dict[int, float]
    _forgotten_s: float
    _forgotten_calls: float
    contention: Contention | None

    if TYPE_CHECKING:
        def _recheck(self, config_id: str, latency_ms: float) -> None: ...

    def prior_latency_ms(self, c: Configuration) -> float:
        """The interpreter time believed before this device has measured ``c``."""
        return self._prior(c)[0]

    def _prior(self, c: Configuration) -> tuple[float, str]:
        if c.id in self._priors:
            return self._priors[c.id], self.prior_source
        if c.latency_ms is not None:
            return c.latency_ms, "manifest"
        return c.invokes * (c.macs / (FALLBACK_GMACS * 1e6) + FALLBACK_OVERHEAD_MS), \
            "MACs fallback"

    def energy_ms(self, c: Configuration) -> float:
        """The cost the battery and heat rules minimise: the interpreter time the device
        profile (else the manifest) measured for ``c`` on one core, a core's active time per
        call at full clock: the energy proxy, precision included (an int8 slice's own
        figure); the MACs-based fallback where nothing was measured."""
        return self.prior_latency_ms(c)

    def overhead_ms(self, c: Configuration) -> float:
        """The SDK's time outside the interpreter for a call answered by ``c`` (load-time)."""
        return self._overhead.get(c.id, 0.0)

    def _end_to_end_prior(self, c: Configuration, n: int = 1) -> float:
        one = self._prior_e2e.get(c.id)
        if one is None:
            one = self.prior_latency_ms(c) + self.overhead_ms(c)
        if n == 1:
            return one
        # n single calls, scaled by what batches of n measured against that on this device
        # (any configuration's: one measured batch size informs the others' first choice)
        return n * self._batch_ratio.get(n, 1.0) * self._predicted(c, self._clock())

    def _learn_batch(self, config_id: str, n: int, estimate_ms: float) -> None:
        """Learn how a batch of ``n`` compares with n single calls (batch ratio) from a
        configuration's estimate at ``n``; it sets the prior of the configurations not yet
        measured at ``n`` (the first batch under a budget no longer assumes n single calls,
        which missed budgets by 2x where the per-sample cost grows with the batch)."""
        c = self._by_id.get(config_id)
        if c is None:
            return
        r = estimate_ms / (n * self._predicted(c, self._clock()))
        old = self._batch_ratio.get(n)
        self._batch_ratio[n] = r if old is None else 0.5 * (old + r)

    def _predicted(self, c: Configuration, now: float, n: int = 1) -> float:
        m = self._measured.get(c.id if n == 1 else (c.id, n))
        prior = self._end_to_end_prior(c, n)
        if m is None:
            return prior
        return self._blend(prior, m[0], self._stale(m, now))

    @staticmethod
    def _blend(prior: float, measured: float, stale: float) -> float:
        if stale < 1e-3:
            return measured
        return (1 - stale) * measured + stale * prior

    def predicted_latency_ms(self, c: Configuration, n: int = 1) -> float:
        """End-to-end latency of a call of ``n`` samples answered by ``c`` alone."""
        return self._predicted(c, self._clock(), n)

    def latency_source(self, c: Configuration) -> str:
        """Where :meth:`predicted_latency_ms` comes from (explain())."""
        m = self._measured.get(c.id)
        prior = f"{self._prior(c)[1]} + SDK overhead"
        if m is None:
            return prior
        stale = self._stale(m, self._clock())
        return "measured EWMA" if stale < 1e-3 else \
            f"measured EWMA aged {stale:.0%} toward {prior}"

    def _stale(self, m: tuple[float, float, int], now: float) -> float:
        """Weight of the prior: 0 for a fresh measurement, -> 1 as it ages."""
        age = max((now - m[1]) / self.half_life_s, (self._calls - m[2]) / self.half_life_calls)
        w: float = 0.5 ** age
        return 1.0 - w

    @staticmethod
    def memory_need_mb(c: Configuration) -> float:
        if c.memory_mb is not None:
            return c.memory_mb
        return sum(f.bytes for f in c.files) * 4 / 2 ** 20  # DEQUANTIZE keeps an fp32 copy

    def _need_mb(self, c: Configuration) -> float:
        """:meth:`memory_need_mb`, computed once per configuration (decide() runs every call,
        over every candidate: 68 for 4 widths x S = 1 .. 8)."""
        need = self._need.get(c.id)
        return self.memory_need_mb(c) if need is None else need

    def observe(self, config_id: str, latency_ms: float, n: int = 1) -> None:
        """Fold a measured end-to-end latency (of ``n`` samples) into the configuration's
        estimate. Robust input: the estimate follows the median of the last three
        measurements, so one outlier (a first use the warm-up missed, a page fault, a GC
        pause: 10-1000x a 0.1 ms call) never moves it, while a sustained change passes on its
        second call. The first measurement is held; the second makes the estimate the median
        of the prior and the two (an outlier test against the prior). Then an EWMA: the older
        the previous estimate, the more the new measurement counts."""
        now = self._clock()
        raw = latency_ms
        key = config_id if n == 1 else (config_id, n)
        measured, calls = self._measured, self._calls
        old = measured.get(key)
        last = self._last2.get(key)
        ct = self.contention
        if ct is not None and n == 1:  # a stall? against the estimate before this call
            e = old[0] if old is not None else self._prior_e2e.get(config_id)
            if e is not None:  # Contention.note, inline: this runs every call
                ct.work_ms += e
                if raw > ct.slower_than * e or raw > ct.target_ms:
                    ct.stall(raw - e, raw > ct.slower_than * e, e)
                elif ct.engaged:
                    ct.tick()
        if old is not None and (now - old[1] > self._forgotten_s
                                or calls - old[2] > self._forgotten_calls):
            # aged to the prior (weight > 0.999): measured afresh, as if never before
            old = last = None
            del measured[key]
        self._last2[key] = (raw, raw) if last is None else (last[1], raw)
        if last is None:  # held: the next measurement decides whether it was an outlier
            new = None
        else:
            c = self._by_id.get(config_id)
            prior, stale, w = 0.0, 0.0, self.ewma
            if old is None:  # the prior stands in for the missing third measurement
                b = last[1]
                a = b if c is None else self._end_to_end_prior(c, n)
            else:
                a, b = last
                # _stale, _blend and _end_to_end_prior inline: this runs on every call;
                # a fresh estimate (no decision made since, younger than Policy._fresh_s:
                # pinned calls back to back) has aged less than min(1e-3, ewma), so it
                # skips them
                if now - old[1] >= self._fresh_s or old[2] != calls:
                    age = (now - old[1]) / self.half_life_s
                    if old[2] == calls - 1 and age <= self._one_call_age:
                        stale = self._one_call_stale  # the one decision outweighs the time
                    else:
                        age = max(age, (calls - old[2]) / self.half_life_calls)
                        stale = 1.0 - 0.5 ** age
                    if stale > w:
                        w = stale
                    if stale < 1e-3 or c is None:
                        stale = 0.0
                    else:  # the estimate and the two measurements age toward the prior
                        p1 = self._prior_e2e.get(config_id) if n == 1 else None
                        prior = self._end_to_end_prior(c, n) if p1 is None else p1
                        a = (1 - stale) * a + stale * prior
                        b = (1 - stale) * b + stale * prior
                        self._last2[key] = (b, raw)  # the aged companion, kept
            if a > b:
                a, b = b, a
            latency_ms = a if raw < a else (b if raw > b else raw)  # the median of three
            if old is None:
                new = latency_ms
            else:
                pred = old[0] if stale == 0.0 else (1 - stale) * old[0] + stale * prior
                if w == self.ewma:
                    # a fresh estimate moves at most `ewma` of the way to `outlier` x
                    # itself per call (two spikes in three calls pass the median), while a
                    # sustained 2x slowdown is still followed at the full EWMA rate
                    cap = self.outlier * pred
                    if latency_ms > cap:
                        latency_ms = cap
                new = (1 - w) * pred + w * latency_ms
            measured[key] = (new, now, calls)
            if n > 1:
                self._learn_batch(config_id, n, new)
        if n == 1:
            if new is not None and new < self._floor.get(config_id, new):
                self._floor[config_id] = new  # (a floor left lower than it could be is one)
                self._candidates = None
            if config_id in self._group:  # a precision variant: still the fastest?
                self._recheck(config_id, raw)
