"""Which configuration answers a call: the budget rule, stated once, and the plan it leads to.

Among the configurations that fit both budgets, pick the lowest validation NLL in the manifest;
ties go to the larger width, then to fewer invokes. A configuration fits when its predicted
**end-to-end** latency (what the app waits for ``predict()``: input checks, normalisation,
invokes, the answer's maths) is within the latency budget and its memory need is within the
memory budget, the memory available right now and the runtime's ``memory_cap_mb``. Nothing fits:
the fastest configuration that fits memory (else the smallest), flagged ``budget_met=False`` (or
:class:`BudgetNotMetError` in strict mode, naming the shortfall in ms or MB).

Predicted latency is an EWMA of end-to-end latencies measured on this device once there are any
(fed the median of the last three, the first measurement held until a second confirms it: one
outlier never moves an estimate), else a prior plus the SDK's own overhead: the prior is the
device profile's figure (a measured profile's latency table, or a published profile's MACs-based
estimate) when the runtime was given one, else the manifest's host-measured invoke latency, else a deliberately slow MACs-based
fallback; the overhead (time outside the interpreter) is measured at load and then learned from
every call. A measurement ages: with no new observation its weight halves every ``half_life_s``
seconds or every ``half_life_calls`` decisions, whichever comes first, towards the prior, so a
configuration measured slow during a transient is tried again later instead of being shunned for
good. Hysteresis: while the configuration chosen last still fits, a better one replaces it only if
it fits with ``hysteresis`` (10 %) headroom below the budget.

:meth:`Policy.plan` turns the choice into the stages the runtime executes: one stage for the
``best`` policy; for ``cascade``, a cheaper first stage that answers when confident enough (the
exported plan for the target accuracy, or a climb through the widths on the target-accuracy
thresholds).
"""
from __future__ import annotations

import math
import numbers
import time
from typing import Callable, Mapping, Sequence, TYPE_CHECKING

import numpy as np

from edge_sdk.errors import BudgetError, BudgetNotMetError, ConfigError
from edge_sdk.policy.estimates import Estimates
from edge_sdk.policy.plan import MODES, Plan, Planner, Stage
from edge_sdk.policy.variants import PRECISION_TOLERANCE, Variants
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.device.contention import Contention
    from edge_sdk.policy.budget import Budget, MemoryProbe
    from edge_sdk.policy.rules import RuleSet

def _number(name: str, v: object, lo: float, hi: float, integer: bool = False,
            lo_open: bool = False) -> float:
    # compared before math.isfinite: an int beyond float range (10**400) made it raise a raw
    # OverflowError; Python compares such ints with floats exactly
    ok = (not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real)
          and (not integer or isinstance(v, numbers.Integral))
          # typeshed's numbers.Real declares no comparison with a float
          and (v > lo if lo_open else v >= lo) and v <= hi  # type: ignore[operator]
          and math.isfinite(v))
    if not ok or not isinstance(v, numbers.Real):  # (ok implies Real: narrowed for the checker)
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(f"{name} must be {kind} in {'(' if lo_open else '['}{lo:g}, {hi:g}], "
                          f"got {show(v)}")
    return int(v) if integer and isinstance(v, numbers.Integral) else float(v)


class Policy(Estimates, Planner, Variants):
    """Selects configurations, plans the stages of a call and learns latency on this device
    (what it believes a configuration costs: :class:`edge_sdk.policy.estimates.Estimates`).

    ``overhead_ms``: the SDK's own time per call (outside the interpreter) by configuration id,
    measured at load; ``prior_source`` names where ``priors`` came from (explain()).
    """

    def __init__(self, configs: Sequence[Configuration], memory: MemoryProbe,
                 ewma: float = 0.2, hysteresis: float = 0.1,
                 priors: Mapping[str, float] | None = None, half_life_s: float = 10.0,
                 half_life_calls: int = 200,
                 outlier: float = 2.0, clock: Callable[[], float] = time.monotonic, *,
                 overhead_ms: Mapping[str, float] | None = None,
                 prior_source: str = "device profile", memory_cap_mb: float | None = None,
                 mode: str = "best", target: str = "0.95",
                 precision_tolerance: float = PRECISION_TOLERANCE):
        self.memory = memory
        # variants of one network within this validation NLL answer alike (.variants)
        self.precision_tolerance = _number("precision_tolerance", precision_tolerance, 0, 1e9)
        # ageing in seconds covers an idle app; in decisions, a fast one (0.1 ms calls would
        # otherwise shun a configuration for 10 s after a burst). Retrying a configuration that
        # really is slow costs one late call per >= 1 half-life: <= 0.5 % of calls at 200.
        self.ewma = _number("ewma", ewma, 0, 1, lo_open=True)
        self.hysteresis = _number("hysteresis", hysteresis, 0, 0.9)
        self.half_life_s = _number("half_life_s", half_life_s, 0, 1e9, lo_open=True)
        self.half_life_calls = _number("half_life_calls", half_life_calls, 1, 1e12, integer=True)
        self.outlier = outlier
        # observe()'s and call_stages' shortcut: a measurement younger than this,
        # with no decision made since, has aged less than min(1e-3, ewma) toward the prior
        # (0.5 ** age > 1 - that), so it is neither blended with the prior nor given more than
        # `ewma` weight (a billionth short of the bound, so rounding never crosses it)
        self._fresh_s = -math.log2(1 - min(1e-3, self.ewma)) * self.half_life_s * (1 - 1e-9)
        # ... and one decision later (a policy-chosen call), while the time since is worth at
        # most one decision, it has aged by exactly that decision: this weight of the prior
        self._one_call_age = 1 / self.half_life_calls
        self._one_call_stale = 1.0 - 0.5 ** self._one_call_age
        # an estimate older than ten half-lives weighs the prior over 0.999: observe()
        # starts it afresh (the first measurement held against the prior, as at load)
        self._forgotten_s = 10 * self.half_life_s
        self._forgotten_calls = 10 * self.half_life_calls
        if mode not in MODES:
            raise ConfigError(f"policy must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.target = mode, target
        self.climb_only = False  # cascade: ignore exported plans, climb on thresholds
        # final configuration id -> its exported plans for this target accuracy, cheapest
        # first (Planner._plans_into)
        self._pairs: dict[str, list[tuple[float, Configuration, Configuration, float]]] = {}
        self.memory_cap_mb = memory_cap_mb
        self._calls = 0  # decisions made (choose), the second clock measurements age by
        self._priors = dict(priors or {})
        self.prior_source = prior_source
        self._overhead = dict(overhead_ms or {})
        self._clock = clock
        # id (or (id, batch size)) -> (EWMA ms, when observed, decisions made by then)
        self._measured: dict[str | tuple[str, int], tuple[float, float, int]] = {}
        self.first_use_ms: dict[str, float] = {}  # creation + first invoke, kept out of the EWMA
        # id (or (id, batch size)) -> its last two raw measurements (observe()'s median)
        self._last2: dict[str | tuple[str, int], tuple[float, float]] = {}
        self._batch_ratio: dict[int, float] = {}  # batch size -> measured / n single calls
        self._last: str | None = None
        self._single: dict[str, Stage] = {}  # call_stages' one-stage plans
        # the device rules (set by use_rules) and the contention they may measure
        self.rules: RuleSet | None = None
        self.contention: Contention | None = None
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
        self._need = {c.id: self.memory_need_mb(c) for c in self._configs}
        # static per configuration: the prior plus the SDK overhead, looked up on every call
        self._prior_e2e = {c.id: self.prior_latency_ms(c) + self.overhead_ms(c)
                           for c in self._configs}
        # the rule's order, computed once: the first configuration that fits is the choice;
        # precision variants of one network stand as one, the fastest of them (.variants)
        self._group_variants()
        # a lower bound of each one-sample prediction, whatever its age: _predicted blends
        # the measurement towards the prior, so it lies between the two, and observe()
        # lowers the bound to every smaller measurement. call_stages passes over a
        # configuration whose floor exceeds the budget without working out its staleness
        # (a policy-chosen call first rules out every better configuration)
        self._floor = {cid: min(p, self._measured[cid][0]) if cid in self._measured else p
                       for cid, p in self._prior_e2e.items()}
        # (latency budget, memory limit, _ranked without the leading configurations that
        # budget and limit rule out by floor and memory need) of the last one-sample
        # call_stages: both only ever rule a configuration out for longer (a need is fixed, a
        # floor only falls, and every fall empties this), so a call under the same budget
        # and limit starts where the last one's candidates began
        self._candidates: tuple[float | None, float, list[Configuration]] | None = None

    @property
    def ranked(self) -> list[Configuration]:
        """Every configuration in the rule's order of preference (quality rank 1 first), a
        network's other precision variants right after the one that answers for it."""
        return self.with_variants(self._ranked)

    def use_rules(self, rules: RuleSet | None, contention: Contention | None = None) -> None:
        """Apply ``rules`` (edge_sdk.policy.rules) from the next decision on; ``contention``:
        the stall estimate the calls feed (observe) and UnderContention reads."""
        self.rules, self.contention = rules, contention
        self._rerank()

    def _rerank(self) -> None:
        self._ranked = self._rank()
        self._candidates = None

    # ---- the rule --------------------------------------------------------------------------
    def _mem_ok(self, c: Configuration, mem_limit: float) -> bool:
        need = self._need.get(c.id)
        return (self.memory_need_mb(c) if need is None else need) <= mem_limit

    def _fits(self, c: Configuration, latency: float | None, mem_limit: float, now: float,
              slack: float = 1.0, n: int = 1) -> bool:
        if not self._mem_ok(c, mem_limit):
            return False
        return latency is None or self._predicted(c, now, n) <= latency * slack

    def memory_limit_mb(self, budget: Budget) -> float:
        """The tightest of the memory budget, the memory available now and ``memory_cap_mb``."""
        limit = self.memory.available_mb()
        v = budget.memory_mb
        if v is not None and v < limit:
            limit = v
        v = self.memory_cap_mb
        if v is not None and v < limit:
            limit = v
        return limit

    def fits(self, c: Configuration, budget: Budget, slack: float = 1.0, n: int = 1) -> bool:
        return self._fits(c, budget.latency_ms, self.memory_limit_mb(budget), self._clock(),
                          slack, n)

    def fits_memory(self, c: Configuration, budget: Budget) -> bool:
        need = self._need.get(c.id)  # _mem_ok inline: every call asks
        return (self.memory_need_mb(c) if need is None else need) <= self.memory_limit_mb(budget)

    @staticmethod
    def preference(c: Configuration) -> tuple[float, float, int]:
        return (c.val_nll, -c.width, c.invokes)

    def cost(self, c: Configuration) -> tuple[float, float, int]:
        return (self.predicted_latency_ms(c), self.memory_need_mb(c), c.invokes)

    def decide(self, budget: Budget, n: int = 1, among: Sequence[Configuration] | None = None
               ) -> tuple[Configuration, bool, Callable[[], str]]:
        """(configuration, fits, why) for a call of ``n`` samples; changes no state. ``why``
        builds the reason only when asked (strict errors, explain()): this runs every call."""
        pool = self._ranked if among is None else sorted(among, key=self.preference)
        now, limit, latency = self._clock(), self.memory_limit_mb(budget), budget.latency_ms
        memo: dict[str, float] = {}

        def pred(c: Configuration) -> float:  # each configuration's prediction once per call
            v = memo.get(c.id)
            if v is None:
                v = memo[c.id] = self._predicted(c, now, n)
            return v

        def fits(c: Configuration, slack: float = 1.0) -> bool:
            return self._mem_ok(c, limit) and (latency is None or pred(c) <= latency * slack)

        best = next((c for c in pool if fits(c)), None)
        last = self._by_id.get(self._last) if self._last is not None else None
        if best is not None and last is not None and best.id != last.id and last in pool \
                and fits(last):
            # Hysteresis: the incumbent fits, and a better configuration replaces it only if
            # that one fits with `hysteresis` headroom; so a latency hovering at the budget
            # does not flap, and no configuration is ever kept beyond the budget.
            # preferred = earlier in the order (the device rules may reorder it by cost)
            if among is None:
                pos, big = self._pos, len(self._pos)
                rank: Callable[[Configuration], object] = lambda c: pos.get(c.id, big)  # noqa
            else:
                rank = self.preference
            headroom, keep = 1 - self.hysteresis, rank(last)
            better = next((c for c in pool if c is last or (
                rank(c) < keep and fits(c, headroom))), last)  # type: ignore[operator]
            if better is last and rank(best) < keep:  # type: ignore[operator]
                higher = best
                return last, True, lambda: (
                    f"kept {last.id}: {higher.id} ranks higher but does not fit with "
                    f"{self.hysteresis:.0%} headroom (hysteresis)")
            best = better
        if best is not None:
            chosen = best
            return best, True, lambda: (
                f"the best-ranked configuration that fits (quality rank "
                f"{pool.index(chosen) + 1} of {len(pool)})")
        in_memory = [c for c in pool if self._mem_ok(c, limit)]
        if in_memory:  # only the latency budget is out of reach: the fastest that fits memory
            cheapest = min(in_memory, key=lambda c: (pred(c), self._need_mb(c),
                                                     c.invokes))
            return cheapest, False, lambda: (
                f"no configuration fits latency {latency:g} ms end-to-end"
                + (f" for a batch of {n}" if n > 1 else "")
                + f" within the memory limit of {limit:.4g} MB; the fastest, {cheapest.id}, is "
                f"predicted at {pred(cheapest):.4g} ms ({pred(cheapest) - (latency or 0.0):.4g} ms "
                f"over)")  # (latency is set here: without it, fitting memory fits)
        small = min(pool, key=lambda c: (self._need_mb(c), pred(c), c.invokes))
        need = self.memory_need_mb(small)
        return small, False, lambda: (
            f"no configuration fits the memory limit of {limit:.4g} MB (memory budget "
            f"{_mb(budget.memory_mb)}, available {self.memory.available_mb():.0f} MB, "
            f"memory_cap_mb {_mb(self.memory_cap_mb)}); the smallest, {small.id}, needs "
            f"{need:.4g} MB: {need - limit:.4g} MB short")

    def choose(self, budget: Budget, strict: bool = False,
               among: Sequence[Configuration] | None = None, n: int = 1
               ) -> tuple[Configuration, bool]:
        """(configuration, fits) for this call; records the decision (hysteresis, ageing)."""
        c, ok, why = self.decide(budget, n, among)
        self._calls += 1
        if ok:
            self._last = c.id
        elif strict:
            raise BudgetNotMetError(why())
        return c, ok

    def check_pinned(self, c: Configuration, budget: Budget, n: int = 1) -> None:
        """Strict mode, a pinned configuration: BudgetNotMetError unless it is predicted to fit."""
        limit = self.memory_limit_mb(budget)
        if not self._mem_ok(c, limit):
            need = self.memory_need_mb(c)
            raise BudgetNotMetError(f"{c.id} needs {need:.4g} MB, the memory limit is "
                                    f"{limit:.4g} MB: {need - limit:.4g} MB short")
        if budget.latency_ms is not None:
            pred = self.predicted_latency_ms(c, n)
            if pred > budget.latency_ms:
                raise BudgetNotMetError(
                    f"{c.id} is predicted at {pred:.4g} ms end-to-end, over the latency budget "
                    f"{budget.latency_ms:g} ms by {pred - budget.latency_ms:.4g} ms")

    # ---- the plan --------------------------------------------------------------------------
    def call_stages(self, budget: Budget, strict: bool = False, n: int = 1
                    ) -> tuple[Stage, ...]:
        """``plan(budget, strict, n).stages``, what the runtime executes, made cheaply in the
        common case (``plan`` cost 6 us a call, ~15 us right after an invoke): for
        the ``best`` policy whose incumbent (the last choice) still fits, :meth:`decide`'s
        rule worked out in one pass over the rule's order, with no reason built: the first
        configuration ranked above the incumbent that fits with the hysteresis headroom, else
        the incumbent (with no incumbent, the first that fits). Its one stage is cached
        (``predicted_ms``, read only for a cascade's later stages, is 0). Anything else (an
        incumbent that no longer fits, another policy) goes through :meth:`plan`. Records
        the decision as :meth:`plan` does."""
        rules = self.rules
        if rules is not None and rules.signal.n != rules.seen:  # a new reading: judge again
            self._rerank()
        last = self._last
        if self.mode == "best" and (last is None or last in self._by_id):
            latency = budget.latency_ms
            limit = self.memory_limit_mb(budget)
            need, now = self._need, None
            measured, prior_e2e = self._measured, self._prior_e2e
            floor = self._floor if n == 1 else None
            switch: Configuration | None = None
            ranked = self._ranked
            if floor is not None:
                cand = self._candidates
                if cand is not None and cand[0] == latency and cand[1] == limit:
                    ranked = cand[2]
                else:
                    i = 0
                    for c in ranked:
                        if need[c.id] <= limit and (latency is None or floor[c.id] <= latency):
                            break
                        i += 1
                    ranked = ranked[i:]
                    self._candidates = (latency, limit, ranked)
            for c in ranked:
                cid = c.id
                pred = 0.0
                if need[cid] > limit:
                    fit = False
                elif latency is None:
                    fit = True
                elif floor is not None and floor[cid] > latency:
                    fit = False  # over the budget however stale its measurement
                else:
                    if now is None:
                        now = self._clock()
                    prior = prior_e2e.get(cid) if n == 1 else None
                    if prior is None:
                        pred = self._predicted(c, now, n)
                    else:
                        # _predicted(c, now, 1) inline (~0.5 us less per
                        # configuration ranked above the choice): the prior until measured,
                        # then the measurement with the prior blended in by its age
                        m = measured.get(cid)
                        if m is None:
                            pred = prior
                        elif m[2] == self._calls and now - m[1] < self._fresh_s:
                            pred = m[0]  # aged less than 1e-3 (observe()'s fresh estimate)
                        else:
                            stale = self._stale(m, now)
                            pred = m[0] if stale < 1e-3 else \
                                (1 - stale) * m[0] + stale * prior
                    fit = pred <= latency
                if last is None or cid == last:
                    if not fit:
                        if last is None:
                            continue
                        break  # the incumbent no longer fits: plan() decides
                    pick = c if switch is None else switch
                    self._calls += 1
                    self._last = pick.id
                    st = self._single.get(pick.id)
                    if st is None:
                        st = self._single[pick.id] = Stage(pick, None, 0.0)
                    return (st,)
                if fit and switch is None and (
                        latency is None or pred <= latency * (1 - self.hysteresis)):
                    # ranked above the incumbent (so preferred: earlier in the order): it
                    # replaces the incumbent only with the headroom (decide()'s hysteresis)
                    switch = c
        return self.plan(budget, strict, n).stages

    def plan(self, budget: Budget, strict: bool = False, n: int = 1) -> Plan:
        """The stages of a call (see the module docstring). Records the decision."""
        best, ok = self.choose(budget, strict, n=n)
        return self._stages(best, ok, budget, n)

    def preview(self, budget: Budget, n: int = 1) -> Plan:
        """What :meth:`plan` would do now, changing no state (explain())."""
        best, ok, why = self.decide(budget, n)
        return self._stages(best, ok, budget, n, why())

def _mb(v: float | None) -> str:
    return "none" if v is None else f"{v:g} MB"
