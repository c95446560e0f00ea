"""Precision variants: configurations that compute the same network (width, scope, samples)
on other kernels (float32, dynamic-range int8, int8 end to end; ``Configuration.precision``).

Variants whose validation NLL is within ``precision_tolerance`` of the best of them answer
alike (the exporter measured each one), so they are one choice for the budget rule: the group
ranks where its best variant ranks, and the variant that answers is the one predicted fastest
on this device now (the device profile's or the manifest's latency until this process has
measured it, then the measurement), re-checked as measurements come in. A variant that loses
more than the tolerance is a configuration of its own, ranked by its own quality. A mixin of
:class:`edge_sdk.policy.policy.Policy`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration

__all__ = ["PRECISION_TOLERANCE", "RECHECK_CALLS", "Variants"]

# validation NLL a variant may lose to its group's best and still stand in for it: the
# integer slices' goal (NLL after temperature within +0.01 of the float slice's)
PRECISION_TOLERANCE = 0.01
# a group's fastest variant is re-checked once per this many measurements of its variants
# (and at the first): the check costs a prediction per variant, the other calls a counter
RECHECK_CALLS = 32


class Variants:
    # What Policy sets and provides (declared for the checker).
    precision_tolerance: float
    _configs: list[Configuration]
    _ranked: list[Configuration]
    _candidates: object
    _last: str | None
    _clock: Callable[[], float]

    if TYPE_CHECKING:
        def _predicted(self, c: Configuration, now: float, n: int = 1) -> float: ...

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
        self._seen: dict[str, int] = {}  # first variant's id -> measurements since the check
        for group in {g[0].id: g for g in self._group.values()}.values():
            self._active[group[0].id] = min(group, key=lambda c: (
                self._predicted(c, 0.0), self.preference(c)))
        self._ranked = self._rank()

    def _rank(self) -> list[Configuration]:
        """The rule's order over what may answer: ungrouped configurations and each group's
        active variant, a group at its best variant's place."""
        keyed = []
        for c in self._configs:
            group = self._group.get(c.id)
            if group is None:
                keyed.append((self.preference(c), c))
            elif c is self._active[group[0].id]:
                keyed.append((min(self.preference(v) for v in group), c))
        return [c for _, c in sorted(keyed, key=lambda t: t[0])]

    @property
    def candidates(self) -> list[Configuration]:
        """What may answer a call now, in the rule's order: each network once, a network with
        precision variants as the variant predicted fastest."""
        return list(self._ranked)

    def variants(self, c: Configuration) -> tuple[Configuration, ...]:
        """``c``'s equivalent variants (``c`` alone when it has none)."""
        return self._group.get(c.id, (c,))

    def active_variant(self, c: Configuration) -> Configuration:
        """The variant of ``c``'s network that answers now: the one predicted fastest."""
        group = self._group.get(c.id)
        return c if group is None else self._active[group[0].id]

    def _recheck(self, config_id: str) -> None:
        """After a measurement of ``config_id``: re-pick its group's fastest variant every
        :data:`RECHECK_CALLS` measurements of the group (the first included)."""
        group = self._group.get(config_id)
        if group is None:
            return
        key = group[0].id
        seen = self._seen.get(key)
        if seen is not None and seen + 1 < RECHECK_CALLS:
            self._seen[key] = seen + 1
            return
        self._seen[key] = 0
        now = self._clock()
        fastest = min(group, key=lambda c: (self._predicted(c, now), self.preference(c)))
        old = self._active[key]
        if fastest is old:
            return
        self._active[key] = fastest
        self._ranked = self._rank()
        self._candidates = None
        if self._last == old.id:
            self._last = fastest.id  # the incumbent is the group, whichever variant answers
