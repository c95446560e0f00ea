"""Rules an app states once, instead of budgets it recomputes: what the runtime does when the
device runs on a low battery (:class:`OnBattery`), runs hot or throttles its clock
(:class:`WhenHot`), runs short of memory (:class:`UnderMemoryPressure`) or shares its CPU with
another busy task (:class:`UnderContention`).

A rule reads the device (:class:`~edge_sdk.device.state.DeviceState`, or the contention measured
from the runtime's own calls) and, while it is *engaged*, narrows or reorders what the budget
rule may choose among: the battery and heat rules prefer the **cheapest** configuration within
``within_pt`` accuracy points of the bundle's best (cost: :meth:`RuleContext.energy_ms`, a core's
active time per call), the memory rule the best-ranked (in practice the largest) configuration
that fits what is left, the contention rule the best-ranked whose ``quantile`` latency stays
under its target. Rules apply in the order given; the budget (:class:`~edge_sdk.policy.budget.
Budget`) still applies on top, and hysteresis on both sides (a rule disengages only past a band
beyond its threshold; a configuration replaces the incumbent only with headroom) keeps a
steady device from flapping.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, Sequence, Union

from edge_sdk.device.state import DeviceState, Signal
from edge_sdk.errors import ConfigError
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.device.contention import Contention
    from edge_sdk.device.monitor import DeviceMonitor

__all__ = ["OnBattery", "Rule", "RuleContext", "RuleSet", "UnderContention",
           "UnderMemoryPressure", "WhenHot", "accuracy"]

log = logging.getLogger("edge_sdk")

BATTERY_BAND = 2.0  # percent above the threshold before an engaged battery rule lets go
HEAT_BAND_C = 5.0  # degrees below the threshold before an engaged heat rule lets go
CLOCK_BAND = 0.05  # clock ratio above the threshold likewise
MEMORY_BAND = 1.1  # available memory x this above the threshold likewise
_READING = {"battery_percent": "battery", "temperature_c": "CPU temperature",
            "clock_ratio": "CPU clock (current vs maximum)", "available_mb": "available memory"}


class RuleContext(Protocol):
    """What a rule asks the policy (:class:`edge_sdk.policy.policy.Policy` provides it)."""

    hysteresis: float
    _last: str | None

    def energy_ms(self, c: Configuration) -> float: ...

    def _need_mb(self, c: Configuration) -> float: ...

    def predicted_latency_ms(self, c: Configuration, n: int = 1) -> float: ...

    def variants(self, c: Configuration) -> tuple[Configuration, ...]: ...


def accuracy(c: Configuration) -> float:
    """The accuracy a rule compares: the manifest's validation accuracy, else (a bundle written
    before it was recorded) its test accuracy."""
    v = getattr(c, "val_accuracy", None)
    return float(v) if v is not None else float(c.test["raw"]["accuracy"])


def _positive(owner: str, name: str, v: object, top: float = math.inf) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= top \
        and math.isfinite(v)
    if not ok:
        raise ConfigError(f"{owner}.{name} must be a positive number (at most {top:g}), got "
                          f"{show(v)}")
    return float(v)  # type: ignore[arg-type]


def cheapest_within(pool: Sequence[Configuration], ctx: RuleContext, within_pt: float,
                    best: float) -> tuple[list[Configuration], str]:
    """The configurations within ``within_pt`` points of ``best`` accuracy, cheapest first."""
    # each network at its cheapest precision (the answering variant is the fastest measured
    # here, not necessarily the cheapest by the profile: int8 may lose on a tiny network)
    pool = [min(ctx.variants(c), key=lambda v: (ctx.energy_ms(v), v is not c)) for c in pool]
    keep = [c for c in pool if accuracy(c) >= best - within_pt / 100 - 1e-9] or list(pool[:1])
    pos = {c.id: i for i, c in enumerate(pool)}
    keep.sort(key=lambda c: (ctx.energy_ms(c), pos[c.id]))
    top, first = keep[0], pool[0]
    return keep, (f"the cheapest within {within_pt:g} pt of the best accuracy {best:.4f}: "
                  f"{top.id} (accuracy {accuracy(top):.4f}, {ctx.energy_ms(top):.3g} CPU-ms "
                  f"a call vs {ctx.energy_ms(first):.3g} for {first.id})")


@dataclass(frozen=True)
class OnBattery:
    """On battery (not plugged in) below ``below_percent``: the cheapest configuration within
    ``within_pt`` accuracy points of the best."""

    below_percent: float = 30.0
    within_pt: float = 1.0
    name: ClassVar[str] = "OnBattery"
    needs: ClassVar[tuple[str, ...]] = ("battery_percent",)

    def __post_init__(self) -> None:
        _positive(self.name, "below_percent", self.below_percent, 100)
        _positive(self.name, "within_pt", self.within_pt, 100)

    def reading(self, s: DeviceState, ctx: RuleSet, was: bool) -> str | None:
        if s.battery_percent is None or s.plugged:
            return None
        edge = self.below_percent + (BATTERY_BAND if was else 0.0)
        if s.battery_percent >= edge:
            return None
        return f"{s.describe('battery_percent')}, {s.describe('plugged')} " \
               f"(< {self.below_percent:g} %)"

    def apply(self, pool: Sequence[Configuration], ctx: RuleSet
              ) -> tuple[list[Configuration], str]:
        return cheapest_within(pool, ctx.policy, self.within_pt, ctx.best_accuracy)


@dataclass(frozen=True)
class WhenHot:
    """The CPU at or above ``above_c`` °C, or its clock at or below ``clock_below`` of its
    maximum (throttled): the cheapest configuration within ``within_pt`` points of the best,
    which heats the device least."""

    above_c: float = 80.0
    clock_below: float = 0.8
    within_pt: float = 2.0
    name: ClassVar[str] = "WhenHot"
    needs: ClassVar[tuple[str, ...]] = ("temperature_c", "clock_ratio")

    def __post_init__(self) -> None:
        _positive(self.name, "above_c", self.above_c, 200)
        _positive(self.name, "clock_below", self.clock_below, 1)
        _positive(self.name, "within_pt", self.within_pt, 100)

    def reading(self, s: DeviceState, ctx: RuleSet, was: bool) -> str | None:
        hot = s.temperature_c is not None and \
            s.temperature_c >= self.above_c - (HEAT_BAND_C if was else 0.0)
        slow = s.clock_ratio is not None and \
            s.clock_ratio <= self.clock_below + (CLOCK_BAND if was else 0.0)
        if not (hot or slow):
            return None
        parts = ([f"{s.describe('temperature_c')} (>= {self.above_c:g} °C)"] if hot else []) + \
            ([f"{s.describe('clock_ratio')} (<= {self.clock_below:.0%})"] if slow else [])
        return ", ".join(parts)

    def apply(self, pool: Sequence[Configuration], ctx: RuleSet
              ) -> tuple[list[Configuration], str]:
        return cheapest_within(pool, ctx.policy, self.within_pt, ctx.best_accuracy)


@dataclass(frozen=True)
class UnderMemoryPressure:
    """Available memory below ``below_mb``: the best-ranked (in practice the largest)
    configuration whose memory need leaves ``keep_free_mb`` available to the rest of the
    device."""

    below_mb: float = 512.0
    keep_free_mb: float = 256.0
    name: ClassVar[str] = "UnderMemoryPressure"
    needs: ClassVar[tuple[str, ...]] = ("available_mb",)

    def __post_init__(self) -> None:
        _positive(self.name, "below_mb", self.below_mb, 2 ** 20)
        _positive(self.name, "keep_free_mb", self.keep_free_mb, 2 ** 20)

    def reading(self, s: DeviceState, ctx: RuleSet, was: bool) -> str | None:
        if s.available_mb is None:
            return None
        edge = self.below_mb * (MEMORY_BAND if was else 1.0)
        if s.available_mb >= edge:
            return None
        return f"{s.describe('available_mb')} (< {self.below_mb:g} MB)"

    def apply(self, pool: Sequence[Configuration], ctx: RuleSet
              ) -> tuple[list[Configuration], str]:
        avail = ctx.state.available_mb
        limit = (avail or 0.0) - self.keep_free_mb
        pol = ctx.policy
        need = pol._need_mb
        # a network that fits at another precision stays, answered by that variant
        pool = [c if need(c) <= limit else min(pol.variants(c), key=lambda v: (need(v),
                                                                              v is not c))
                for c in pool]
        keep = [c for c in pool if need(c) <= limit]
        if not keep:  # ties between equal needs go to the cheapest
            small = min(pool, key=lambda c: (need(c), pol.energy_ms(c)))
            return [small], (f"nothing fits {limit:.4g} MB ({avail:.0f} MB available less "
                             f"{self.keep_free_mb:g} kept free): the smallest, {small.id} "
                             f"({need(small):.4g} MB)")
        return keep, (f"the best-ranked that fits {limit:.4g} MB ({avail:.0f} MB available "
                      f"less {self.keep_free_mb:g} kept free): {keep[0].id} "
                      f"({need(keep[0]):.4g} MB)")


@dataclass(frozen=True)
class UnderContention:
    """Keep the ``quantile`` of the call latency under ``latency_ms`` while the CPU is shared:
    a call that runs ``slower_than`` times its expected time is a stall
    (:mod:`edge_sdk.device.contention`), and a configuration of expected latency ``t`` stalls
    with probability ``1 - exp(-rate * t)``; the best-ranked configuration whose stall
    probability stays within ``1 - quantile`` (or whose stalled latency still meets the target)
    answers. A configuration other than the incumbent must do so with ``headroom``."""

    latency_ms: float
    quantile: float = 0.95
    slower_than: float = 1.5
    # a challenger's stall probability must stay this far inside the incumbent's allowance:
    # the estimate of a steady contention wanders by ~15 % (a few stalls per window), and a
    # configuration near the allowance would otherwise go in and out with it
    headroom: float = 0.25
    name: ClassVar[str] = "UnderContention"
    needs: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        _positive(self.name, "latency_ms", self.latency_ms, 86_400_000)
        if not (isinstance(self.quantile, float) and 0.5 <= self.quantile < 1):
            raise ConfigError(f"{self.name}.quantile must be a float in [0.5, 1), got "
                              f"{show(self.quantile)}")
        _positive(self.name, "slower_than", self.slower_than, 1000)
        if not (isinstance(self.headroom, float) and 0 <= self.headroom < 1):
            raise ConfigError(f"{self.name}.headroom must be a float in [0, 1), got "
                              f"{show(self.headroom)}")
        if self.slower_than <= 1:
            raise ConfigError(f"{self.name}.slower_than must be above 1 (a stall is a call "
                              f"slower than expected), got {show(self.slower_than)}")

    def _allowed(self, c: Configuration, ctx: RuleSet, rate: float, moving: bool) -> bool:
        pol = ctx.policy
        # a network at its fastest precision (the one the policy settles on: a variant being
        # probed for a few calls must not make the rule drop the network)
        t = min(pol.predicted_latency_ms(v) for v in pol.variants(c))
        if t > self.latency_ms:
            return False
        ct = ctx.contention
        assert ct is not None
        if t + ct.extra_ms <= self.latency_ms:
            return True  # even a stalled call meets the target
        if c.id == pol._last:
            return ct.p_stall(t, rate) <= 1 - self.quantile
        # the headroom only guards an incumbent that still keeps the target ("moving": it
        # does not, so the best that keeps it answers, as the budget rule's hysteresis)
        return ct.p_stall(t, rate) <= (1 - self.quantile) * (1 if moving else 1 - self.headroom)

    def reading(self, s: DeviceState, ctx: RuleSet, was: bool) -> str | None:
        ct = ctx.contention
        if ct is None or not ct.contended:  # a quiet core: misses are the body's, not ours
            return None
        return f"{ct.describe()} (target p{self.quantile * 100:g} {self.latency_ms:g} ms)"

    def apply(self, pool: Sequence[Configuration], ctx: RuleSet
              ) -> tuple[list[Configuration], str]:
        ct = ctx.contention
        assert ct is not None
        rate = ct.rate
        last = next((c for c in pool if c.id == ctx.policy._last), None)
        moving = last is None or not self._allowed(last, ctx, rate, False)
        keep = [c for c in pool if self._allowed(c, ctx, rate, moving)]
        if not keep:
            # the fastest by the profile, not by this process's estimates: stalls inflate
            # whichever answers, and "the fastest" by them went round every width in turn
            pol = ctx.policy
            every = [v for c in pool for v in pol.variants(c)]
            fast = min(every, key=pol.energy_ms)
            last = next((v for v in every if v.id == pol._last), None)
            if last is not None and pol.energy_ms(last) <= 1.1 * pol.energy_ms(fast):
                fast = last
            return [fast], (f"no configuration keeps p{self.quantile * 100:g} under "
                            f"{self.latency_ms:g} ms: the fastest, {fast.id}")
        top = keep[0]
        t = ctx.policy.predicted_latency_ms(top)
        return keep, (f"the best-ranked whose p{self.quantile * 100:g} stays under "
                      f"{self.latency_ms:g} ms: {top.id} ({t:.3g} ms, stalls on "
                      f"{ct.p_stall(t, rate):.1%} of calls)")


Rule = Union[OnBattery, WhenHot, UnderMemoryPressure, UnderContention]
RULES = (OnBattery, WhenHot, UnderMemoryPressure, UnderContention)


def check_rules(rules: object) -> tuple[Rule, ...]:
    """``rules`` as a tuple of rules (one of each kind at most), or ConfigError."""
    if rules is None:
        return ()
    items = (rules,) if isinstance(rules, RULES) else rules
    kinds = ", ".join(k.__name__ for k in RULES)
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise ConfigError(f"rules must be a sequence of edge_sdk rules ({kinds}), got "
                          f"{show(rules)}")
    out = tuple(items)
    for r in out:
        if not isinstance(r, RULES):
            raise ConfigError(f"rules: {show(r)} is not a rule; expected one of {kinds}")
    names = [r.name for r in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"rules: one {', '.join(sorted(dup))} rule at most, got {len(out)}")
    return out


class RuleSet:
    """The rules of one model, the readings they act on and what they decided last.

    The policy compares ``signal.n`` with ``seen`` on every call (one integer compare) and
    re-applies :meth:`view` to its order when the device monitor published a new reading or the
    contention estimate changed."""

    def __init__(self, rules: Sequence[Rule], policy: RuleContext,
                 monitor: DeviceMonitor | None, contention: Contention | None,
                 every: Sequence[Configuration]):
        self.rules = tuple(rules)
        self.policy = policy
        self.monitor = monitor
        self.contention = contention
        self.best_accuracy = max(accuracy(c) for c in every)
        self.engaged: dict[str, str] = {}  # rule name -> the reading that engaged it
        self.effects: dict[str, str] = {}  # rule name -> what it decided
        self.notes: list[str] = []
        # the monitor's and the contention estimate's change counter (one Signal, shared)
        sources = [x.signal for x in (monitor, contention) if x is not None]
        if len({id(x) for x in sources}) > 1:
            raise ValueError("the monitor and the contention estimate must share one Signal")
        self.signal = sources[0] if sources else Signal()
        self.seen = -1
        self._inert: set[str] = set()

    @property
    def state(self) -> DeviceState:
        return self.monitor.state if self.monitor is not None else DeviceState()

    def stale(self) -> bool:
        return self.signal.n != self.seen

    def view(self, order: Sequence[Configuration]) -> list[Configuration]:
        """``order`` narrowed and reordered by every engaged rule, in the rules' order."""
        self.seen = self.signal.n
        state, pool = self.state, list(order)
        engaged: dict[str, str] = {}
        effects: dict[str, str] = {}
        for r in self.rules:
            self._check_inert(r, state)
            got = r.reading(state, self, r.name in self.engaged)
            if got is None:
                continue
            narrowed, effect = r.apply(pool, self)
            if r.name == UnderContention.name and narrowed == pool:
                continue  # stalls seen, but the best-ranked still keeps the target
            engaged[r.name], effects[r.name] = got, effect
            pool = narrowed
        self.engaged, self.effects = engaged, effects
        return pool

    def _check_inert(self, r: Rule, s: DeviceState) -> None:
        if not r.needs or r.name in self._inert or self.monitor is None or s.at == 0.0:
            return
        if all(getattr(s, f) is None for f in r.needs):
            self._inert.add(r.name)
            what = " or ".join(_READING[f] for f in r.needs)
            text = f"{r.name}: this device reports no {what}; the rule stays inert"
            self.notes.append(text)
            log.warning("edge_sdk: %s", text)

    def reason(self) -> str:
        """The engaged rules with their readings and decisions ('' when none is)."""
        return "; ".join(f"rule {n} ({self.engaged[n]}): {self.effects[n]}" for n in self.engaged)
