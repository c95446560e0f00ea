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

    if TYPE_CHECKING:
        def predicted_latency_ms(self, c: Configuration, n: int = 1) -> float: ...

        def fits(self, c: Configuration, budget: Budget, slack: float = 1.0,
                 n: int = 1) -> bool: ...

    def _stages(self, best: Configuration, ok: bool, budget: Budget, n: int,
                why: str | None = None) -> Plan:
        why = why or ("fits" if ok else "nothing fits: the cheapest")
        lat_best = self.predicted_latency_ms(best, n)
        final = Stage(best, None, lat_best)
        if self.mode == "best":
            return Plan((final,), ok, why)
        if not self.climb_only and any(best.id in c.cascade for c in self._configs):
            plans = [(self.predicted_latency_ms(c, n)
                      + (1 - (c.cascade[best.id]["coverage"] or 0.0)) * lat_best, c)
                     for c in self._configs
                     if best.id in c.cascade and c.cascade[best.id]["threshold"] is not None
                     and self.fits(c, budget, n=n)]
            expected, first = min(plans, key=lambda t: t[0], default=(math.inf, None))
            if first is None or expected >= lat_best:
                return Plan((final,), ok, why + "; no first stage pays off")
            return Plan((Stage(first, first.cascade[best.id]["threshold"],
                               self.predicted_latency_ms(first, n)), final), ok,
                        why + f"; cascade: {first.id} answers when confident "
                              f"(expected {expected:.4g} ms vs {lat_best:.4g} ms)")
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
