"""edge_sdk.policy.rules: the device rules' validation, and each rule moving the configuration a
real small bundle answers with, on injected readings.

The model is loaded with ``rules=[...]``, ``readers=Readers(...)`` returning values the test
sets (all labelled simulated) and a monitor interval of an hour, so the timer never reads on its
own: a test changes a value and calls ``model._monitor.poll()``. Every expectation is computed
from the manifest and the policy (accuracy(), energy_ms, memory_need_mb, predicted latency),
never from a run's numbers. Only the ``bundle`` fixture needs torch (it trains and exports once
per session; the torch-free run reuses ``EDGE_SDK_TEST_BUNDLE``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edge_sdk
from edge_sdk.device.readers import Readers
from edge_sdk.errors import ConfigError
from edge_sdk.policy import rules as R
from edge_sdk.device.contention import MIN_SLICE_MS
from edge_sdk.policy.rules import (
    OnBattery,
    UnderContention,
    UnderMemoryPressure,
    WhenHot,
    accuracy,
    check_rules,
)

PLENTY_MB = 1e6
HOUR = 3600.0
SIMULATED = frozenset({"battery_percent", "plugged", "temperature_c", "clock_ratio",
                       "available_mb"})


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("make, name", [
    (lambda: OnBattery(below_percent=0), "OnBattery.below_percent"),
    (lambda: OnBattery(below_percent=-5), "OnBattery.below_percent"),
    (lambda: OnBattery(below_percent=101), "OnBattery.below_percent"),
    (lambda: OnBattery(below_percent=math.nan), "OnBattery.below_percent"),
    (lambda: OnBattery(below_percent=True), "OnBattery.below_percent"),
    (lambda: OnBattery(below_percent="30"), "OnBattery.below_percent"),
    (lambda: OnBattery(within_pt=0), "OnBattery.within_pt"),
    (lambda: OnBattery(within_pt=math.inf), "OnBattery.within_pt"),
    (lambda: OnBattery(within_pt=None), "OnBattery.within_pt"),
    (lambda: WhenHot(above_c=0), "WhenHot.above_c"),
    (lambda: WhenHot(above_c=250), "WhenHot.above_c"),
    (lambda: WhenHot(clock_below=0), "WhenHot.clock_below"),
    (lambda: WhenHot(clock_below=1.5), "WhenHot.clock_below"),
    (lambda: WhenHot(within_pt=-1), "WhenHot.within_pt"),
    (lambda: UnderMemoryPressure(below_mb=0), "UnderMemoryPressure.below_mb"),
    (lambda: UnderMemoryPressure(below_mb=math.inf), "UnderMemoryPressure.below_mb"),
    (lambda: UnderMemoryPressure(keep_free_mb=-1), "UnderMemoryPressure.keep_free_mb"),
    (lambda: UnderContention(latency_ms=0), "UnderContention.latency_ms"),
    (lambda: UnderContention(latency_ms=math.nan), "UnderContention.latency_ms"),
    (lambda: UnderContention(latency_ms="5"), "UnderContention.latency_ms"),
    (lambda: UnderContention(5.0, quantile=0.4), "UnderContention.quantile"),
    (lambda: UnderContention(5.0, quantile=1.0), "UnderContention.quantile"),
    (lambda: UnderContention(5.0, quantile=1), "UnderContention.quantile"),
    (lambda: UnderContention(5.0, quantile=math.nan), "UnderContention.quantile"),
    (lambda: UnderContention(5.0, slower_than=1.0), "UnderContention.slower_than"),
    (lambda: UnderContention(5.0, slower_than=0.5), "UnderContention.slower_than"),
    (lambda: UnderContention(5.0, slower_than=0), "UnderContention.slower_than"),
    (lambda: UnderContention(5.0, headroom=1.0), "UnderContention.headroom"),
    (lambda: UnderContention(5.0, headroom=-0.1), "UnderContention.headroom"),
])
def test_rule_validation_names_the_field(make, name):
    with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
        make()


def test_valid_rules():
    assert OnBattery().below_percent == 30.0 and OnBattery().within_pt == 1.0
    assert OnBattery(below_percent=100, within_pt=100).below_percent == 100
    assert WhenHot(above_c=200, clock_below=1).clock_below == 1
    assert UnderMemoryPressure(below_mb=1, keep_free_mb=0.5).keep_free_mb == 0.5
    u = UnderContention(5, quantile=0.5, slower_than=1.01, headroom=0.0)
    assert (u.latency_ms, u.quantile, u.headroom) == (5, 0.5, 0.0)
    assert UnderContention(5.0, quantile=np.float64(0.99)).quantile == 0.99


def test_check_rules():
    assert check_rules(None) == ()
    assert check_rules([]) == ()
    one = OnBattery()
    assert check_rules(one) == (one,)  # a single rule, not in a list
    every = [OnBattery(), WhenHot(), UnderMemoryPressure(), UnderContention(5.0)]
    assert check_rules(every) == tuple(every)
    assert check_rules(iter(every)) == tuple(every)
    with pytest.raises(ConfigError, match="is not a rule"):
        check_rules([OnBattery(), "WhenHot"])
    with pytest.raises(ConfigError, match="is not a rule"):
        check_rules([None])
    with pytest.raises(ConfigError, match="one OnBattery rule at most"):
        check_rules([OnBattery(), WhenHot(), OnBattery(below_percent=10)])
    with pytest.raises(ConfigError, match="sequence of edge_sdk rules"):
        check_rules("OnBattery")
    with pytest.raises(ConfigError, match="sequence of edge_sdk rules"):
        check_rules(30)


def test_load_checks_rules_readers_and_interval(bundle):
    with pytest.raises(ConfigError, match="is not a rule"):
        edge_sdk.load(bundle, rules=["OnBattery"])
    with pytest.raises(ConfigError, match="one WhenHot rule at most"):
        edge_sdk.load(bundle, rules=[WhenHot(), WhenHot()])
    with pytest.raises(ConfigError, match="readers"):
        edge_sdk.load(bundle, rules=[OnBattery()], readers={"battery": lambda: None})
    for bad in (0, -1, 1e9, math.nan, "1", None):
        with pytest.raises(ConfigError, match="monitor_interval_s"):
            edge_sdk.load(bundle, rules=[OnBattery()], monitor_interval_s=bad)


def test_no_rules_no_monitor(bundle):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    assert m.policy.rules is None and m._monitor is None
    assert m.device is None and m.engaged_rules == {}
    m.close()  # harmless


# --------------------------------------------------------------------------- helpers


@dataclass
class Device:
    """The readings the injected readers return; every one labelled simulated."""

    battery: tuple[float, bool | None] | None = (80.0, False)
    temperature: float | None = None
    clock: float | None = None
    memory: float | None = None
    off: tuple[str, ...] = ()  # readers switched off (None in Readers)

    def readers(self) -> Readers:
        fns = {"battery": lambda: self.battery, "temperature": lambda: self.temperature,
               "clock": lambda: self.clock, "memory": lambda: self.memory}
        for k in self.off:
            fns[k] = None
        return Readers(simulated=SIMULATED, **fns)


@pytest.fixture
def models():
    """load(...) that closes every model it made at teardown."""
    made = []

    def load(bundle, rules, dev: Device | None = None, **kw):
        kw.setdefault("memory_reader", lambda: PLENTY_MB)
        if dev is not None:
            kw["readers"] = dev.readers()
        m = edge_sdk.load(bundle, rules=rules, monitor_interval_s=HOUR, **kw)
        made.append(m)
        return m

    yield load
    for m in made:
        m.close()


@pytest.fixture(scope="module")
def x(bundle) -> np.ndarray:
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    lo, hi = m.input_spec.value_range
    return np.full(m.input_spec.shape[1:], (lo + hi) / 2, np.float32)


@pytest.fixture(scope="module")
def plain(bundle):
    """The same bundle without rules: the unconstrained choice and the quality order."""
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)


def choice(m, x, calls: int = 3) -> str:
    """The configuration the policy answers with (after ``calls`` calls: it settles)."""
    for _ in range(calls):
        p = m.predict(x)
    return p.config_id


def set_device(m, dev: Device, **changes) -> None:
    for k, v in changes.items():
        setattr(dev, k, v)
    m._monitor.poll()


def unconstrained(plain, x) -> str:
    return choice(plain, x)


def cheapest_within(pol, within_pt: float) -> set[str]:
    """The ids of the cheapest configurations within ``within_pt`` points of the best
    accuracy (ties: all of them)."""
    cs = pol.configs
    best = max(accuracy(c) for c in cs)
    keep = [c for c in cs if accuracy(c) >= best - within_pt / 100 - 1e-9]
    lo = min(pol.energy_ms(c) for c in keep)
    return {c.id for c in keep if pol.energy_ms(c) == lo}


def within_all(pol) -> float:
    """A within_pt that admits the cheapest configuration of all (so the rule moves the
    choice away from the most accurate)."""
    cs = pol.configs
    best = max(accuracy(c) for c in cs)
    cheapest = min(cs, key=pol.energy_ms)
    return min(100.0, round((best - accuracy(cheapest)) * 100 + 0.5, 6))


def needs_moving(plain, x, expected: set[str]) -> None:
    if unconstrained(plain, x) in expected:
        pytest.skip("the bundle's unconstrained choice is already the rule's: nothing moves")


def spy_views(m) -> list[dict]:
    """Record what every RuleSet.view saw and decided: the state, the engaged rules, the pool,
    the incumbent and (UnderContention) the rates and the predicted latencies it judged."""
    pol, rs = m.policy, m.policy.rules
    seen: list[dict] = []
    view = rs.view

    def record(order, pool) -> None:
        ct = rs.contention
        seen.append({
            "state": rs.state, "engaged": dict(rs.engaged), "pool": [c.id for c in pool],
            "incumbent": pol._last, "rate": None if ct is None else ct.rate,
            "wide": None if ct is None else ct.rate,
            "extra": None if ct is None else ct.extra_ms,
            "effects": dict(rs.effects),
            "t": {c.id: min(pol.predicted_latency_ms(v) for v in pol.variants(c)) for c in order}})

    def spied(order):
        pool = view(order)
        record(order, pool)
        return pool

    record(pol._quality, pol._ranked)  # the view in force now
    rs.view = spied
    return seen


# --------------------------------------------------------------------------- OnBattery


def test_on_battery_below_threshold_picks_the_cheapest_within(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    dev = Device(battery=(80.0, False))
    m = models(bundle, [OnBattery(within_pt=within)], dev)
    assert choice(m, x) == unconstrained(plain, x)
    assert m.engaged_rules == {}
    set_device(m, dev, battery=(20.0, False))
    assert m.device.battery_percent == 20.0 and m.device.plugged is False
    got = choice(m, x)
    assert got in expected
    assert list(m.engaged_rules) == ["OnBattery"]
    best = max(accuracy(c) for c in m.policy.configs)
    assert accuracy(m.manifest.configuration(got)) >= best - within / 100 - 1e-9


def test_on_battery_default_within(bundle, models, plain, x):
    dev = Device(battery=(20.0, False))
    m = models(bundle, [OnBattery()], dev)
    assert choice(m, x) in cheapest_within(m.policy, OnBattery().within_pt)
    assert "OnBattery" in m.engaged_rules


def test_on_battery_judged_before_the_first_call(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    m = models(bundle, [OnBattery(within_pt=within)], Device(battery=(10.0, False)))
    assert m.predict(x).config_id in expected  # the very first call


def test_on_battery_plugged_in_or_charged_lets_go(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    free = unconstrained(plain, x)
    dev = Device(battery=(20.0, False))
    m = models(bundle, [OnBattery(within_pt=within)], dev)
    assert choice(m, x) in expected
    set_device(m, dev, battery=(20.0, True))  # plugged in
    assert choice(m, x) == free and m.engaged_rules == {}
    set_device(m, dev, battery=(20.0, False))
    assert choice(m, x) in expected
    set_device(m, dev, battery=(20.0, None))  # unknown power source: the percent decides
    assert choice(m, x) in expected
    above = 30.0 + R.BATTERY_BAND + 1
    set_device(m, dev, battery=(above, False))
    assert choice(m, x) == free and m.engaged_rules == {}


def test_on_battery_hysteresis_band(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    free = unconstrained(plain, x)
    assert R.BATTERY_BAND == 2.0
    dev = Device(battery=(31.0, False))
    m = models(bundle, [OnBattery(within_pt=within)], dev)  # default: below 30 %, band 2
    assert choice(m, x) == free  # 31 % not engaged yet
    set_device(m, dev, battery=(29.0, False))
    assert choice(m, x) in expected and "OnBattery" in m.engaged_rules
    set_device(m, dev, battery=(31.0, False))  # within the band: still engaged
    assert choice(m, x) in expected and "OnBattery" in m.engaged_rules
    assert "battery 31 %" in m.engaged_rules["OnBattery"]
    set_device(m, dev, battery=(33.0, False))  # past 30 + 2: released
    assert choice(m, x) == free and m.engaged_rules == {}
    set_device(m, dev, battery=(31.0, False))  # from above: 31 % does not engage
    assert choice(m, x) == free and m.engaged_rules == {}


def test_missing_battery_makes_on_battery_inert_with_one_note(bundle, models, x, plain):
    dev = Device(battery=None, off=("temperature", "clock", "memory"))
    m = models(bundle, [OnBattery()], dev)
    free = unconstrained(plain, x)
    for _ in range(10):
        set_device(m, dev)
        assert choice(m, x, 2) == free
    notes = m.policy.rules.notes
    assert len(notes) == 1, notes
    assert "OnBattery" in notes[0] and "battery" in notes[0] and "inert" in notes[0]
    assert len(m._monitor.notes) == 1 and "no battery" in m._monitor.notes[0]
    assert m.engaged_rules == {}
    assert m.explain().notes == tuple(notes)
    assert f"note: {notes[0]}" in str(m.explain())


def test_battery_reader_switched_off_is_inert_too(bundle, models, x):
    dev = Device(off=("battery", "temperature", "clock", "memory"))
    m = models(bundle, [OnBattery(), WhenHot()], dev)
    choice(m, x)
    assert m.device.battery_percent is None
    notes = m.policy.rules.notes
    assert len(notes) == 2 and {n.split(":")[0] for n in notes} == {"OnBattery", "WhenHot"}


# --------------------------------------------------------------------------- WhenHot


def test_when_hot_by_temperature(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    free = unconstrained(plain, x)
    rule = WhenHot(above_c=80.0, within_pt=within)
    dev = Device(battery=None, temperature=60.0, clock=1.0)
    m = models(bundle, [rule], dev)
    assert choice(m, x) == free
    set_device(m, dev, temperature=85.0)
    assert choice(m, x) in expected
    assert "CPU 85 °C (simulated)" in m.engaged_rules["WhenHot"]
    set_device(m, dev, temperature=80.0 - R.HEAT_BAND_C + 1)  # within the band
    assert choice(m, x) in expected
    set_device(m, dev, temperature=80.0 - R.HEAT_BAND_C - 1)
    assert choice(m, x) == free and m.engaged_rules == {}


def test_when_hot_by_clock_ratio(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    free = unconstrained(plain, x)
    rule = WhenHot(clock_below=0.8, within_pt=within)
    dev = Device(battery=None, temperature=None, clock=1.0)  # no temperature sensor
    m = models(bundle, [rule], dev)
    assert choice(m, x) == free
    set_device(m, dev, clock=0.7)  # throttled
    assert choice(m, x) in expected
    assert "clock 70% of max (simulated)" in m.engaged_rules["WhenHot"]
    set_device(m, dev, clock=0.8 + R.CLOCK_BAND - 0.01)  # within the band
    assert choice(m, x) in expected
    set_device(m, dev, clock=0.8 + R.CLOCK_BAND + 0.01)
    assert choice(m, x) == free and m.engaged_rules == {}
    assert m.policy.rules.notes == []  # one of its two readings is enough: not inert


def test_when_hot_default_within(bundle, models, x):
    m = models(bundle, [WhenHot()], Device(battery=None, temperature=95.0))
    assert choice(m, x) in cheapest_within(m.policy, WhenHot().within_pt)


# --------------------------------------------------------------------------- UnderMemoryPressure


def best_that_fits(pol, order: list[str], limit: float) -> str | None:
    return next((cid for cid in order
                 if pol.memory_need_mb(pol._by_id[cid]) <= limit), None)


def test_under_memory_pressure_fits_what_is_left(bundle, models, plain, x):
    pol = plain.policy
    free = unconstrained(plain, x)
    order = [c.id for c in pol.ranked]
    need = {c.id: pol.memory_need_mb(c) for c in pol.configs}
    smaller = [cid for cid in order if need[cid] < need[free]]
    if not smaller:
        pytest.skip("the unconstrained choice is already the smallest")
    keep = 256.0
    limit = need[smaller[0]] + 1e-3  # what the best-ranked smaller one needs, just about
    expected = best_that_fits(pol, order, limit)
    assert expected is not None and expected != free
    dev = Device(battery=None, memory=2000.0)
    m = models(bundle, [UnderMemoryPressure(below_mb=512, keep_free_mb=keep)], dev)
    assert choice(m, x) == free
    set_device(m, dev, memory=keep + limit)
    got = choice(m, x)
    assert got == expected
    assert m.policy.memory_need_mb(m.manifest.configuration(got)) <= m.device.available_mb - keep
    assert "UnderMemoryPressure" in m.engaged_rules
    assert "MB available (simulated)" in m.engaged_rules["UnderMemoryPressure"]
    # nothing fits what is left: the smallest
    set_device(m, dev, memory=keep + min(need.values()) - 2.0)
    got = choice(m, x)
    assert need[got] == min(need.values())
    assert "nothing fits" in m.policy.rules.effects["UnderMemoryPressure"]
    # plenty again (past below_mb x the band): released
    set_device(m, dev, memory=512 * R.MEMORY_BAND + 1)
    assert choice(m, x) == free and m.engaged_rules == {}


def test_under_memory_pressure_band(bundle, models, plain, x):
    free = unconstrained(plain, x)
    pol = plain.policy
    keep = 10.0
    small = min(pol.configs, key=pol.memory_need_mb)
    if small.id == free:
        pytest.skip("the unconstrained choice is already the smallest")
    dev = Device(battery=None, memory=600.0)
    m = models(bundle, [UnderMemoryPressure(below_mb=500, keep_free_mb=keep)], dev)
    assert m.engaged_rules == {} and choice(m, x) == free
    set_device(m, dev, memory=499.0)  # engaged: everything fits 489 MB, the best-ranked
    assert choice(m, x) == free and "UnderMemoryPressure" in m.engaged_rules
    set_device(m, dev, memory=540.0)  # < 500 x 1.1: still engaged
    choice(m, x)
    assert "UnderMemoryPressure" in m.engaged_rules
    set_device(m, dev, memory=560.0)  # >= 550: released
    choice(m, x)
    assert m.engaged_rules == {}


def test_under_memory_pressure_reads_load_memory_reader_without_readers(bundle, models, plain,
                                                                          x):
    """No readers given: load()'s memory_reader stands in for the memory reading too."""
    pol = plain.policy
    need = {c.id: pol.memory_need_mb(c) for c in pol.configs}
    free = unconstrained(plain, x)
    avail = [2000.0]
    m = models(bundle, [UnderMemoryPressure(below_mb=512, keep_free_mb=300)],
               memory_reader=lambda: avail[0])
    assert choice(m, x) == free
    avail[0] = 300 + min(need.values()) - 2.0
    m._monitor.poll()
    assert m.device.available_mb == avail[0]
    assert need[choice(m, x)] == min(need.values())


def test_under_memory_pressure_follows_a_drop_within_one_mb(bundle, models, plain, x):
    pol = plain.policy
    free = unconstrained(plain, x)
    need = pol.memory_need_mb(pol._by_id[free])
    n = 300
    keep = n + 0.25 - need  # available keep + need + 0.05 and keep + need - 0.05 both round to n
    dev = Device(battery=None, memory=keep + need + 0.05)
    m = models(bundle, [UnderMemoryPressure(below_mb=512, keep_free_mb=keep)], dev)
    assert choice(m, x) == free  # it fits, just
    set_device(m, dev, memory=keep + need - 0.05)  # it no longer does
    got = choice(m, x)
    assert pol.memory_need_mb(pol._by_id[got]) <= m.device.available_mb - keep


# --------------------------------------------------------------------------- UnderContention


class ConfigClock:
    """A fake perf_counter that moves only when an interpreter invokes: each configuration's
    call takes exactly its energy_ms (its prior invoke time), everything else no time;
    ``stall_ms`` is added to the next invoke (a slice of another task)."""

    def __init__(self) -> None:
        self.t, self.stall_ms = 0.0, 0.0

    def __call__(self) -> float:
        return self.t


def config_clock(m) -> ConfigClock:
    clock = ConfigClock()
    seen: set[int] = set()
    for c in m.manifest.configurations:
        step = m.policy.energy_ms(c) / c.invokes
        for it, *_ in m._interpreters(c):
            if id(it) in seen:  # configurations sharing a file share its interpreter
                continue
            seen.add(id(it))

            def invoke(real=it.invoke, step=step):
                real()
                clock.t += (step + clock.stall_ms) / 1000
                clock.stall_ms = 0.0
            it.invoke = invoke
    m._clock = clock
    return clock


@dataclass
class Setting:
    """UnderContention's target and the stall size that excludes the unconstrained choice (the
    incumbent) and admits a narrower configuration (a challenger), from the policy's own
    predicted latencies: each stall probability 1 - exp(-t / extra) on either side of the
    allowance with a margin."""

    latency_ms: float
    extra_ms: float
    quantile: float = 0.95
    headroom: float = 0.25
    free: str = ""
    t: dict = field(default_factory=dict)


def contention_setting(plain, x) -> Setting:
    pol = plain.policy
    free = unconstrained(plain, x)
    c0 = pol._by_id[free]
    energy = {c.id: pol.energy_ms(c) for c in pol.configs}
    narrower = [c.id for c in pol.configs if c.width < c0.width]
    if not narrower:
        pytest.skip("no configuration narrower than the unconstrained choice")
    s = Setting(latency_ms=1.1 * max(energy.values()), extra_ms=0.0, free=free, t=energy)
    e_hi = energy[free] / -math.log(s.quantile)  # below: the incumbent's p_stall > 1 - q
    e_lo = min(energy[c] for c in narrower) / -math.log(1 - (1 - s.quantile) * (1 - s.headroom))
    if not e_lo < e_hi:
        pytest.skip("the widths are too close in latency for a stall size to separate them")
    s.extra_ms = math.sqrt(e_hi * e_lo)
    assert s.latency_ms < energy[free] + s.extra_ms  # a stalled full-width call misses it
    return s


def contention_model(models, bundle, s: Setting, x):
    rule = UnderContention(latency_ms=s.latency_ms, quantile=s.quantile, headroom=s.headroom)
    m = models(bundle, [rule])
    assert m._monitor is None  # the contention rule reads no device sensor
    config_clock(m)
    for c in m.policy.configs:  # every configuration measured: its estimate is its energy_ms
        for _ in range(3):
            m.predict(x, config_id=c.id)
    assert choice(m, x, 5) == s.free
    ct = m.policy.contention
    assert ct is not None and ct.stalls == 0 and not ct.contended  # no stall while warming
    for c in m.policy.configs:
        assert m.policy.predicted_latency_ms(c) == pytest.approx(s.t[c.id], rel=1e-2)
    return m


def check_allowed(view: dict, rule_q: float, headroom: float, target: float) -> None:
    """Every configuration the contention rule left keeps its quantile: its stall probability
    within the allowance (a challenger within the headroom too, unless the incumbent had to
    move), or its stalled latency within the target."""
    allow = 1 - rule_q
    effect = view.get("effects", {}).get("UnderContention", "")
    if effect.startswith("no configuration keeps"):  # none does: the fastest by the profile
        assert len(view["pool"]) == 1
        return
    for cid in view["pool"]:
        t = view["t"][cid]
        assert t <= target * (1 + 1e-9)
        if t + view["extra"] <= target:
            continue
        if cid == view["incumbent"]:
            p = 1 - math.exp(-view["rate"] * t)
            assert p <= allow + 1e-12, (cid, p, allow)
        else:  # the headroom only while the incumbent keeps the target (it stays)
            p = 1 - math.exp(-view["wide"] * t)
            moving = view["incumbent"] not in view["pool"]
            room = allow if moving else allow * (1 - headroom)
            assert p <= room + 1e-12, (cid, p, room)


def contend(ct, extra_ms: float) -> None:
    """The state two slice-sized stalls leave, at a stall size of ``extra_ms`` (the digits
    slices are far faster than a real 4 ms slice, at which no configuration's stall
    probability would reach 5 %: the rule's decision is tested at a size that separates them)."""
    ct.extra_ms, ct.contended, ct.engaged = extra_ms, True, True
    ct._slice_at = ct.work_ms  # the last slice stall: now
    ct.signal.n += 1


def test_under_contention_by_hand_goes_narrower_and_comes_back(bundle, models, plain, x):
    s = contention_setting(plain, x)
    m = contention_model(models, bundle, s, x)
    ct, pol = m.policy.contention, m.policy
    views = spy_views(m)
    width0 = pol._by_id[s.free].width
    contend(ct, s.extra_ms)
    # the premise: the full width's stall probability exceeds 1 - quantile
    assert ct.p_stall(s.t[s.free]) > 1 - s.quantile
    got = m.predict(x).config_id
    assert pol._by_id[got].width < width0
    assert "UnderContention" in m.engaged_rules
    assert s.free not in views[-1]["pool"]
    check_allowed(views[-1], s.quantile, s.headroom, s.latency_ms)
    for _ in range(20):  # it stays narrower while contended
        got = m.predict(x).config_id
        assert pol._by_id[got].width < width0
        assert got in views[-1]["pool"]
    for v in views:
        check_allowed(v, s.quantile, s.headroom, s.latency_ms)
    ct.clear()
    assert choice(m, x) == s.free
    assert m.engaged_rules == {}


def test_under_contention_two_slice_stalls_through_calls_make_it_contended(bundle, models,
                                                                          plain, x):
    """Via the fake clock: two calls that stall by a scheduler's slice make the estimate
    contended and the rules judge at once; what they decide keeps the allowance."""
    s = contention_setting(plain, x)
    m = contention_model(models, bundle, s, x)
    ct = m.policy.contention
    views = spy_views(m)
    for _ in range(2):
        m._clock.stall_ms = 2 * MIN_SLICE_MS
        m.predict(x)
    assert ct.contended and ct.slices == 2
    assert ct.rate >= 1 / ct.extra_ms - 1e-12
    m.predict(x)
    assert views, "the rules judged the contended state"
    check_allowed(views[-1], s.quantile, s.headroom, s.latency_ms)
    ct.clear()
    assert choice(m, x) == s.free


def test_under_contention_short_stalls_move_nothing(bundle, models, plain, x):
    s = contention_setting(plain, x)
    m = contention_model(models, bundle, s, x)
    for _ in range(5):  # stalls shorter than a slice: the body's jitter or a page fault
        m._clock.stall_ms = MIN_SLICE_MS / 4
        assert m.predict(x).config_id == s.free
    ct = m.policy.contention
    assert not ct.contended
    assert choice(m, x) == s.free and m.engaged_rules == {}


# --------------------------------------------------------------------------- explain / reason


def test_reason_and_explain_name_the_rule_and_its_reading(bundle, models, plain, x):
    within = within_all(plain.policy)
    dev = Device(battery=(80.0, False))
    m = models(bundle, [OnBattery(within_pt=within)], dev)
    choice(m, x)
    assert m.policy.rules.reason() == ""
    set_device(m, dev, battery=(20.0, False))
    got = choice(m, x)
    reason = m.policy.rules.reason()
    assert "OnBattery" in reason and "battery 20 %" in reason and "(simulated)" in reason
    assert "on battery (simulated)" in reason
    assert got in reason  # the decision names the configuration it settled on
    ex = m.explain()
    assert ex.chosen == got
    assert any("OnBattery" in r and "battery 20 % (simulated)" in r for r in ex.rules)
    text = str(ex)
    assert "device rule: OnBattery" in text and "battery 20 % (simulated)" in text
    best = max(accuracy(c) for c in m.policy.configs)
    for row in ex.rows:  # the rows the rule leaves out are marked
        c = m.manifest.configuration(row.config_id)
        assert row.ruled_out == (accuracy(c) < best - within / 100 - 1e-9)
        assert row.energy_ms == m.policy.energy_ms(c)


def test_explain_after_a_new_reading_shows_what_the_next_call_does(bundle, models, plain, x):
    within = within_all(plain.policy)
    expected = cheapest_within(plain.policy, within)
    needs_moving(plain, x, expected)
    dev = Device(battery=(80.0, False))
    m = models(bundle, [OnBattery(within_pt=within)], dev)
    choice(m, x)
    set_device(m, dev, battery=(20.0, False))
    ex = m.explain()  # no call since the reading
    assert ex.chosen == m.predict(x).config_id
    assert any("OnBattery" in r for r in ex.rules)


# --------------------------------------------------------------------------- property


@pytest.fixture(scope="module")
def ruled(bundle, plain):
    """One model with three device rules on injected readings, and the view spy."""
    pol = plain.policy
    dev = Device(battery=(80.0, False), temperature=50.0, clock=1.0, memory=2000.0)
    within = within_all(pol)
    accs = sorted({accuracy(c) for c in pol.configs})
    hot_within = max(0.5, (accs[-1] - accs[-2]) * 50) if len(accs) > 1 else 1.0
    rules = [OnBattery(within_pt=within), WhenHot(within_pt=hot_within),
             UnderMemoryPressure(below_mb=512, keep_free_mb=256)]
    m = edge_sdk.load(bundle, rules=rules, readers=dev.readers(), monitor_interval_s=HOUR,
                      memory_reader=lambda: PLENTY_MB)
    views = spy_views(m)
    yield m, dev, rules, views
    m.close()


def reference_engaged(s, was: set[str], rules) -> set[str]:
    """Which rules engage on reading ``s``, written from the rules' documented thresholds and
    bands, independently of the rules' code."""
    bat, hot, mem = rules
    out = set()
    if s.battery_percent is not None and not s.plugged and \
            s.battery_percent < bat.below_percent + (R.BATTERY_BAND if "OnBattery" in was else 0):
        out.add("OnBattery")
    band = "WhenHot" in was
    if (s.temperature_c is not None and s.temperature_c >= hot.above_c - (R.HEAT_BAND_C if band
                                                                          else 0)) or \
            (s.clock_ratio is not None and s.clock_ratio <= hot.clock_below + (R.CLOCK_BAND
                                                                               if band else 0)):
        out.add("WhenHot")
    if s.available_mb is not None and \
            s.available_mb < mem.below_mb * (R.MEMORY_BAND if "UnderMemoryPressure" in was else 1):
        out.add("UnderMemoryPressure")
    return out


readings = st.tuples(
    st.floats(0, 100), st.sampled_from([False, True, None]), st.floats(40, 95),
    st.floats(0.5, 1.0), st.one_of(st.floats(255, 258), st.just(2000.0), st.floats(500, 600)))


@settings(max_examples=5, suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large])
@given(steps=st.lists(st.one_of(st.none(), readings), min_size=200, max_size=200))
def test_never_answers_with_an_excluded_configuration(ruled, x, steps):
    m, dev, rules, views = ruled
    pol = m.policy
    bat, hot, mem = rules
    best = max(accuracy(c) for c in pol.configs)
    for step in steps:
        if step is not None:
            pct, plugged, temp, clk, avail = step
            set_device(m, dev, battery=(pct, plugged), temperature=temp, clock=clk, memory=avail)
        before = len(views)
        was = set(views[-1]["engaged"]) if views else set(pol.rules.engaged)
        got = m.predict(x).config_id
        v = views[-1]
        allowed = set(v["pool"])
        assert got in allowed  # never a configuration the rules excluded
        assert got in {c.id for c in pol.ranked}
        c = pol._by_id[got]
        if len(views) > before:  # judged afresh on this call: check the engagement
            assert set(v["engaged"]) == reference_engaged(v["state"], was, rules), v
        engaged = v["engaged"]
        # what each engaged rule promises, from the state it judged
        pool = list(pol.configs)
        for r in (bat, hot):
            if r.name in engaged:
                pool = [d for d in pool if accuracy(d) >= best - r.within_pt / 100 - 1e-9]
        assert got in {d.id for d in pool}
        if "UnderMemoryPressure" in engaged:
            limit = v["state"].available_mb - mem.keep_free_mb
            fits = [d for d in pool if pol.memory_need_mb(d) <= limit]
            if fits:
                assert pol.memory_need_mb(c) <= limit
            else:
                assert pol.memory_need_mb(c) == min(pol.memory_need_mb(d) for d in pool)
        elif engaged:  # only the accuracy rules: the cheapest they leave
            assert pol.energy_ms(c) == min(pol.energy_ms(d) for d in pool)
