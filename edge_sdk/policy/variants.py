"""Precision variants: configurations that compute the same network (width, scope, samples)
on other kernels (float32, dynamic-range int8, int8 end to end; ``Configuration.precision``).

Variants whose validation NLL is within ``precision_tolerance`` of the best of them answer
alike (the exporter measured each one), so they are one choice for the budget rule: the group
ranks where its best variant ranks, and the variant that answers is the one that runs fastest on
this device, judged on measurements only: the median of its last :data:`RECENT` end-to-end
measurements (one slow call cannot decide it). The priors (the device profile's or the
manifest's latency plus the SDK's time) pick the first variant and say which others are worth
measuring: every :data:`RECHECK_CALLS` measurements of the group, a variant its prior calls
faster than the answering one, or one not measured for :data:`PROBE_CALLS` that was within
:data:`PROBE_WITHIN` of it, answers :data:`RECENT` calls in a row (a probe: the first call after
another interpreter runs from cold caches); then the measured variants are compared, and the
answering one changes only for a clear gain (:data:`SWITCH_GAIN`). A variant that loses more
than the tolerance is a configuration of its own, ranked by its own quality. A mixin of
:class:`edge_sdk.policy.policy.Policy`.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.policy.rules import RuleSet

__all__ = ["PRECISION_TOLERANCE", "PROBE_CALLS", "PROBE_WITHIN", "RECENT", "RECHECK_CALLS",
           "SWITCH_GAIN", "Variants"]

# validation NLL a variant may lose to its group's best and still stand in for it: the
# integer slices' goal (NLL after temperature within +0.01 of the float slice's)
PRECISION_TOLERANCE = 0.01
# a group's fastest variant is re-checked once per this many measurements of its variants
# (and at the first): the check costs a median per variant, the other calls a counter
RECHECK_CALLS = 32
# a variant's speed: the median of its last this many end-to-end measurements
RECENT = 9
# another variant takes over only when it is at least this much faster (no flapping between
# two variants within timing noise)
SWITCH_GAIN = 0.05
# a variant not measured for this many measurements of its group answers RECENT calls in a
# row (a probe), if it was within PROBE_WITHIN x the answering variant's speed: at most RECENT
# calls in this many run a slower variant, and never one far slower
PROBE_CALLS = 1024
PROBE_WITHIN = 1.5


class Variants:
    # What Policy sets and provides (declared for the checker).
    precision_tolerance: float
    _configs: list[Configuration]
    _ranked: list[Configuration]
    _candidates: object
    _last: str | None
    _clock: Callable[[], float]
    rules: RuleSet | None
    _quality: list[Configuration]
    _pos: dict[str, int]

    if TYPE_CHECKING:
        def _predicted(self, c: Configuration, now: float, n: int = 1) -> float: ...

        def _end_to_end_prior(self, c: Configuration, n: int = 1) -> float: ...

        def _need_mb(self, c: Configuration) -> float: ...

        @staticmethod
        def preference(c: Configuration) -> tuple[float, float, int]: ...

    def _group_variants(self) -> None:
        """Group the equivalent variants and rank the groups (each by its best variant)."""
        by_net: dict[tuple[float, str, int], list[Configuration]] = {}
        for c in self._configs:
            by_net.setdefault(c.variant_of, []).append(c)
        self._group: dict[str, tuple[Configuration, ...]] = {}
        for members in by_net.values():
            if len({c.weights for c in members}) < len(members):
                continue  # two of one route: separate configurations, not precision variants
            best = min(c.val_nll for c in members)
            alike = tuple(c for c in members if c.val_nll <= best + self.precision_tolerance)
            if len(alike) > 1:
                for c in alike:
                    self._group[c.id] = alike
        self._active: dict[str, Configuration] = {}  # first variant's id -> the one answering
        # first variant's id -> its group's measurements so far, and that count at the last
        # check; a variant's id -> that count at its own last measurement (or probe decision)
        self._count: dict[str, int] = {}
        self._checked: dict[str, int] = {}
        self._at: dict[str, int] = {c: 0 for c in self._group}
        # first variant's id -> (the variant a probe replaced, probe calls still to run)
        self._probe: dict[str, tuple[Configuration, int]] = {}
        self._recent: dict[str, deque[float]] = {c: deque(maxlen=RECENT) for c in self._group}
        for group in {g[0].id: g for g in self._group.values()}.values():
            self._count[group[0].id] = 0
            self._active[group[0].id] = min(group, key=lambda c: (
                self._predicted(c, 0.0), self.preference(c)))
        self._ranked = self._rank()

    def _rank(self) -> list[Configuration]:
        """The rule's order over what may answer: ungrouped configurations and each group's
        active variant, a group at its best variant's place; then what the engaged device
        rules leave of it, in their order (``_quality`` keeps it before them, ``_pos`` the
        positions after)."""
        keyed = []
        for c in self._configs:
            group = self._group.get(c.id)
            if group is None:
                keyed.append((self.preference(c), c))
            elif c is self._active[group[0].id]:
                keyed.append((min(self.preference(v) for v in group), c))
        order = [c for _, c in sorted(keyed, key=lambda t: t[0])]
        self._quality = order
        # the device rules (edge_sdk.policy.rules) narrow and reorder it while engaged
        ruled = order if self.rules is None else self.rules.view(order)
        self._pos = {c.id: i for i, c in enumerate(ruled)}  # hysteresis compares positions
        return ruled

    @property
    def candidates(self) -> list[Configuration]:
        """What may answer a call now, in the rule's order: each network once, a network with
        precision variants as its answering variant (:meth:`active_variant`)."""
        return list(self._ranked)

    def with_variants(self, order: list[Configuration]) -> list[Configuration]:
        """``order`` with each network's other precision variants right after the one that
        answers for it."""
        return [v for c in order for v in (c, *(o for o in self.variants(c) if o is not c))]

    def variants(self, c: Configuration) -> tuple[Configuration, ...]:
        """``c``'s equivalent variants (``c`` alone when it has none)."""
        return self._group.get(c.id, (c,))

    def active_variant(self, c: Configuration) -> Configuration:
        """The variant of ``c``'s network that answers now: the one judged fastest (its prior
        until the group's variants are measured, then the median of its recent measurements)."""
        group = self._group.get(c.id)
        return c if group is None else self._active[group[0].id]

    def _recheck(self, config_id: str, latency_ms: float) -> None:
        """After a measurement of ``config_id`` (end to end, one sample): note it, and every
        :data:`RECHECK_CALLS` measurements of the group (the first included) re-pick the
        group's fastest variant, or probe one not measured for :data:`PROBE_CALLS`."""
        group = self._group.get(config_id)
        if group is None:
            return
        self._recent[config_id].append(latency_ms)
        key = group[0].id
        n = self._count[key] = self._count[key] + 1
        at = self._at
        at[config_id] = n
        probing = self._probe.get(key)
        if probing is not None:
            probed, left = probing
            if left > 1:  # the probe runs RECENT calls in a row
                self._probe[key] = (probed, left - 1)
                return
            del self._probe[key]
        else:
            probed = None
            checked = self._checked.get(key)
            if checked is not None and n - checked < RECHECK_CALLS:
                return
        self._checked[key] = n
        old = self._active[key]
        recent = self._recent

        def speed(v: Configuration) -> float:
            r = recent[v.id]
            return statistics.median(r) if len(r) >= 3 else self._end_to_end_prior(v)

        if probed is None:
            # a variant is only ever preferred on measurements: one its prior calls faster
            # than the answering one's speed, or one not measured for PROBE_CALLS that was
            # within PROBE_WITHIN of it, first answers RECENT calls in a row (a probe)
            # (never one that needs more memory: a memory budget the answering variant fits,
            # the probe fits too)
            due = [v for v in group if v is not old and self._need_mb(v) <= self._need_mb(old)
                   and ((len(recent[v.id]) < 3 and speed(v) < speed(old))
                        or (n - at[v.id] >= PROBE_CALLS
                            and speed(v) < PROBE_WITHIN * speed(old)))]
            for v in group:
                if n - at[v.id] >= PROBE_CALLS:
                    at[v.id] = n  # probed now, or not worth it, for another while
            if due:
                self._probe[key] = (old, RECENT)
                return self._set_active(key, old, min(due, key=speed))
        base = probed or old
        pool = [v for v in group if len(recent[v.id]) >= 3] or [base]
        fastest = min(pool, key=lambda v: (speed(v), self.preference(v)))
        if base in pool and speed(fastest) > (1 - SWITCH_GAIN) * speed(base):
            fastest = base
        self._set_active(key, old, fastest)

    def _set_active(self, key: str, old: Configuration, new: Configuration) -> None:
        if new is old:
            return
        self._active[key] = new
        self._ranked = self._rank()
        self._candidates = None
        if self._last == old.id:
            self._last = new.id  # the incumbent is the group, whichever variant answers
