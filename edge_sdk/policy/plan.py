"""The plan of a call: the stages the runtime executes. One stage for the ``best`` policy; for
``cascade``, a cheaper first stage that answers when its confidence reaches the threshold the
bundle exported for it (the cascade plans of the manifest), or, with no exported plan, a climb
through the widths on the target-accuracy thresholds. A mixin of
:class:`edge_sdk.policy.policy.Policy`, which chooses the configuration the plan ends in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_sdk.bundle.configuration import cascade_plan

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.policy.budget import Budget

__all__ = ["MODES", "Plan", "Planner", "Stage"]

MODES = ("best", "cascade")


@dataclass(frozen=True)
class Stage:
    """One configuration the runtime runs. ``accept``: the confidence at which this stage's
    answer stands (None: the last stage, it always stands)."""

    config: Configuration
    accept: float | None
    predicted_ms: float  # end-to-end, what the budget check before this stage adds


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    fits: bool  # whether the rule found a configuration predicted to fit
    reason: str


class Planner:
    # What Policy sets and provides (declared for the checker).
    mode: str
    target: str
    climb_only: bool
    _configs: list[Configuration]
    _pairs: dict[str, list[tuple[float, Configuration, Configuration, float]]]

    if TYPE_CHECKING:
        def predicted_latency_ms(self, c: Configuration, n: int = 1) -> float: ...

        def fits(self, c: Configuration, budget: Budget, slack: float = 1.0,
                 n: int = 1) -> bool: ...

        def variants(self, c: Configuration) -> tuple[Configuration, ...]: ...

        def prior_latency_ms(self, c: Configuration) -> float: ...

    def _plans_into(self, best: Configuration
                    ) -> list[tuple[float, Configuration, Configuration, float]]:
        """The exported plans ending in ``best``'s network, at any of its precisions (each
        plan pairs one precision: its threshold, coverage and conformal quantiles were fitted
        on that pair), cheapest first: (expected interpreter ms, first, final, threshold).

        The plan's expected cost is worked out on the interpreter figures the policy starts
        from (the device profile's, else the bundle's host measurements): the first stage's
        invoke, plus the final one's on the share the first does not answer (the plan's
        validation coverage for this target accuracy); the SDK's own time is paid once per
        call either way. Not on this process's end-to-end measurements: the first stages'
        differences (2-10 us at the digits bundle's widths) are below their noise, and
        plans chosen on them flipped call by call between equivalent variants, so the
        first stage answered whatever share the last flip left it (measured: 36-88 %
        against a plan's 92 %). Static per target accuracy: worked out once."""
        out = []
        for f in self.variants(best):
            for c in self._configs:
                got = cascade_plan(c, f.id, self.target)
                if got is None or got[0] is None:
                    continue
                out.append((self.prior_latency_ms(c) + (1 - got[1]) * self.prior_latency_ms(f),
                            c, f, got[0]))
        return sorted(out, key=lambda t: (t[0], t[1].id))

    def _stages(self, best: Configuration, ok: bool, budget: Budget, n: int,
                why: str | None = None) -> Plan:
        why = why or ("fits" if ok else "nothing fits: the cheapest")
        lat_best = self.predicted_latency_ms(best, n)
        final = Stage(best, None, lat_best)
        if self.mode == "best":
            return Plan((final,), ok, why)
        pairs = self._pairs.get(best.id)
        if pairs is None:
            pairs = self._pairs[best.id] = self._plans_into(best)
        if not self.climb_only and pairs:
            # the cheapest exported plan by the interpreter figures that fits the budget
            # (measured estimates: robust to one outlier, ageing back to the prior)
            lat_prior = self.prior_latency_ms(best)
            for expected, first, tail, threshold in pairs:
                if expected >= lat_prior:
                    break  # this and every later plan costs more than best alone
                if self.fits(first, budget, n=n) and (tail is best or self.fits(tail, budget,
                                                                                n=n)):
                    return Plan((Stage(first, threshold, self.predicted_latency_ms(first, n)),
                                 Stage(tail, None, self.predicted_latency_ms(tail, n))), ok,
                                why + f"; cascade: {first.id} answers when confident, else "
                                      f"{tail.id} (interpreter {expected:.4g} ms expected vs "
                                      f"{lat_prior:.4g} ms)")
            return Plan((final,), ok, why + "; no first stage pays off")
        # no exported plans: climb the widths of best's scope and sample count on the
        # target-accuracy thresholds (one rung per width: with S = 1 .. S_max each its own
        # configuration, a width has several of a scope)
        ladder = sorted((c for c in self._configs if c.scope == best.scope
                         and c.samples == best.samples
                         and c.width <= best.width and self.fits(c, budget, n=n)),
                        key=lambda c: c.width) or [best]
        stages = []
        for i, c in enumerate(ladder):
            last = i + 1 == len(ladder)
            t = c.thresholds.get(self.target)
            stages.append(Stage(c, None if last else (math.inf if t is None else t),
                                self.predicted_latency_ms(c, n)))
        return Plan(tuple(stages), ok, why + f"; climb through {len(stages)} width(s)")
