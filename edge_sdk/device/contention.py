"""Contention for the CPU, measured from the runtime's own calls.

A CPU shared with another busy task is time-sliced: the runtime's calls run at their usual speed
until the scheduler hands the core over, and the call that straddles the hand-over waits a whole
slice of the other task (4 ms on this kernel: tick-based, 250 Hz). Measured on a 2-core host, a
busy process pinned to the model's core: every configuration's median latency is unchanged, its
p95 jumps by ~4 ms once ``its latency / our slice`` passes 5 % of calls, and a paced app (a call
every 2 ms) is not slowed at all (the woken task preempts the busy one). So contention is not a
slowdown factor but a **stall rate**: stalls per ms of our own computing, ``rate``, and a stall's
extra time, ``extra_ms``. A call of ``t`` ms then stalls with probability ``1 - exp(-rate * t)``,
which is what a tail-latency rule needs to pick the widest configuration that keeps its
quantile (:class:`edge_sdk.policy.rules.UnderContention`).

A *stall* is a call that ran at least ``slower_than`` times what the policy expected of it (its
latency estimate, robust to stalls: the median of three); a call over the rule's target counts
in the rate too (a shared core also slows the body of the distribution: its caches are shared),
but not in a stall's size. The core is *contended* once two stalls of at least
:data:`MIN_SLICE_MS` (another task's slice, not a page fault) fall within ``window_ms`` of our
call time; from then on a fair scheduler preempts us about once per slice of the other task, so
the rate is at least ``1 / extra_ms`` at once (no need to wait for a dozen stalls to estimate
it). The contention is over when no stall has come for :data:`QUIET_SLICES` times the time
between stalls it measured (and at least ``QUIET_MS`` of calls): under a steady contention
such a gap comes by chance with probability ``e^-10`` per gap, once in minutes.

Linux's pressure stall information (``/proc/pressure/cpu``) was tried as a faster signal of the
end and of a stall's cause, and left out: on this kernel its ``total`` is aggregated in bursts
(a reader on another core saw it move every 32 ms at the median, 376 ms at the longest, while
the model was preempted every 8 ms).
"""
from __future__ import annotations

import math

from edge_sdk.device.state import Signal

__all__ = ["Contention"]

# a stall this long or longer is taken for another task's slice: measured on this host (a VM,
# 250 Hz tick), a busy task on the model's core costs 4-6 ms a stall, while a quiet core still
# stalls 0.5-1.6 ms now and then (41 such calls in 10 s at full width, in clusters: the
# hypervisor, interrupts). A shorter stall counts in the rate, never as contention; a kernel
# whose slices are shorter than this reacts through the slow window only (docs/runtime.md)
MIN_SLICE_MS = 2.0
QUIET_SLICES = 10.0  # no stall for this many measured gaps between stalls: contention is over
QUIET_MS = 20.0  # ... and for at least this many ms of calls
REJUDGE = 16  # while the state holds, the rules judge the rate again every this many stalls


class Contention:
    """Stalls in an exponential window of the runtime's own call time.

    The policy's ``observe`` runs :meth:`note` inline on every call: one addition and two
    comparisons unless the call stalled (and, while contended, a third). ``signal`` counts every
    change a rule must see: the core turning contended or quiet, and every :data:`REJUDGE`
    stalls (judging costs ~15 µs inside the next call, as long as a digits call: judging on
    every stall made that call a miss, a stall of its own, and so on)."""

    def __init__(self, slower_than: float = 1.5, target_ms: float = math.inf,
                 window_ms: float = 40.0, slow_window_ms: float = 400.0,
                 signal: Signal | None = None):
        self.slower_than, self.target_ms = slower_than, target_ms
        self.window_ms, self.slow_window_ms = window_ms, slow_window_ms
        self.work_ms = 0.0  # cumulative ms of calls (the windows' own clock)
        # exponentially weighted stall count in the slow window, as of work_ms == self._at
        self._slow = self._at = 0.0
        self._slice_at = -math.inf  # work_ms of the last stall of at least MIN_SLICE_MS
        self.stalls = 0  # counted since the last clear
        self.slices = 0  # stalls of at least MIN_SLICE_MS since the last clear
        self.extra_ms = 0.0  # EWMA of a stall's extra ms
        self.signal = Signal() if signal is None else signal
        self.contended = False
        self.engaged = False  # a stall was seen: every call checks whether it is over

    def note(self, expected_ms: float, latency_ms: float) -> None:
        """One call that the policy expected to take ``expected_ms`` took ``latency_ms``
        (Estimates.observe runs the same lines inline)."""
        self.work_ms += expected_ms
        if latency_ms > self.slower_than * expected_ms or latency_ms > self.target_ms:
            self.stall(latency_ms - expected_ms, latency_ms > self.slower_than * expected_ms,
                       expected_ms)
        elif self.engaged:
            self.tick()

    def stall(self, extra_ms: float, real: bool = True, expected_ms: float = 0.0) -> None:
        """A call ``extra_ms`` slower than the ``expected_ms`` expected: a stall (``real``:
        ``slower_than`` its expected time) or a miss of the target by a call that was not.
        Counted when it is another task's slice (:data:`MIN_SLICE_MS`) or misses the
        target; a shorter real stall within the target is the body's jitter."""
        was = self.contended
        if real and extra_ms < MIN_SLICE_MS and extra_ms <= self.target_ms - expected_ms:
            return  # the body's jitter (1.5x a 0.07 ms call is 0.035 ms), within the target
        if real and extra_ms >= MIN_SLICE_MS:
            self.contended = self.contended or self.work_ms - self._slice_at <= self.window_ms
            self._slice_at = self.work_ms
            self.slices += 1
            self.extra_ms = extra_ms if self.extra_ms == 0.0 else \
                0.8 * self.extra_ms + 0.2 * extra_ms
        self._slow = self._slow * math.exp((self._at - self.work_ms) / self.slow_window_ms) + 1
        self._at = self.work_ms
        self.stalls += 1
        self.engaged = True
        if self.contended != was or self.stalls % REJUDGE == 0:
            self.signal.n += 1

    def tick(self) -> None:
        """A call that did not stall, after one did: is the contention over? (While not
        contended: once the windows have forgotten the stalls, stop asking.)"""
        if self.contended:
            gap = QUIET_SLICES / self.rate
            if self.work_ms - self._slice_at >= max(gap, QUIET_MS):
                self.clear()
        elif self.work_ms - self._at > 5 * self.slow_window_ms:
            self.clear()

    def clear(self) -> None:
        """Forget the stalls: the core is quiet again."""
        self._slow = 0.0
        self._slice_at = -math.inf
        self.stalls = self.slices = 0
        was, self.contended, self.engaged = self.contended, False, False
        if was:
            self.signal.n += 1

    @property
    def rate(self) -> float:
        """Stalls per ms of the runtime's own call time: the slow window's estimate
        (``slow_window_ms``: steady, not fooled by a burst of misses on a quiet core) and,
        while the core is contended, at least one per stall length (a fair scheduler's
        slice: known from the second stall on, no need to count a dozen). The fast window's
        estimate is not used: between a steady contention's stalls it swings by half, which
        let configurations near the allowance in and out (15 switches in 10 s, measured)."""
        slow = self._slow * math.exp((self._at - self.work_ms) / self.slow_window_ms)
        r = slow / self.slow_window_ms
        if self.contended and self.extra_ms > 0:
            r = max(r, 1.0 / self.extra_ms)
        return r

    def p_stall(self, latency_ms: float, rate: float | None = None) -> float:
        """The probability that a call of ``latency_ms`` stalls, at the current rate."""
        r = self.rate if rate is None else rate
        return 1.0 - math.exp(-r * latency_ms)

    def describe(self) -> str:
        r = self.rate
        if r == 0.0:
            return "no stalls from contention in the last calls"
        return f"{r * 1e3:.3g} stalls per s of calls, +{self.extra_ms:.3g} ms each"
