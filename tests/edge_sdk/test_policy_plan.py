"""edge_sdk.policy.policy.Policy.plan: the policy owns the whole decision (the choice and, for the
cascade, its stages); the runtime only executes the stages. Pure: fake configurations and
clock, no interpreter."""
from __future__ import annotations

import dataclasses
import math

import pytest
from test_policy import FakeClock, config

from edge_sdk.errors import BudgetNotMetError, ConfigError
from edge_sdk.policy.budget import Budget, MemoryProbe
from edge_sdk.policy.policy import Policy


def ladder(plans: bool):
    """Three point widths; with ``plans`` the two narrow ones carry a cascade plan towards the
    widest (coverage 0.9, thresholds 0.7 / 0.8)."""
    cs = [config("w025", width=0.25, val_nll=0.5, latency_ms=1.0),
          config("w050", width=0.5, val_nll=0.4, latency_ms=2.0),
          config("w100", width=1.0, val_nll=0.2, latency_ms=8.0)]
    cs = [dataclasses.replace(c, thresholds={"0.95": t}) for c, t in zip(cs, (0.6, 0.7, 0.9))]
    if plans:
        cs = [dataclasses.replace(c, cascade={"w100": {"threshold": t, "coverage": 0.9,
                                                       "max_loss": 0.002}})
              if c.id != "w100" else c for c, t in zip(cs, (0.7, 0.8, None))]
    return cs


def policy(cs, **kw):
    return Policy(cs, MemoryProbe(reader=lambda: 1e9, clock=FakeClock()), clock=FakeClock(),
                  **kw)


def ids(plan):
    return [s.config.id for s in plan.stages]


def test_best_is_one_stage_the_rules_choice():
    pol = policy(ladder(plans=True))
    plan = pol.plan(Budget())
    assert ids(plan) == ["w100"] and plan.stages[0].accept is None and plan.fits
    assert ids(pol.plan(Budget(latency_ms=3.0))) == ["w050"]


def test_cascade_with_plans_is_two_stages_the_cheapest_expected_first():
    pol = policy(ladder(plans=True), mode="cascade")
    plan = pol.plan(Budget())
    # expected latency: w025 1 + 0.1 * 8 = 1.8, w050 2 + 0.8 = 2.8: w025 first
    assert ids(plan) == ["w025", "w100"]
    assert plan.stages[0].accept == 0.7 and plan.stages[1].accept is None
    assert plan.stages[0].predicted_ms == pytest.approx(1.0)
    assert "cascade" in plan.reason


def test_a_first_stage_that_does_not_pay_is_left_out():
    cs = [dataclasses.replace(c, cascade={k: {**v, "coverage": 0.0}
                                          for k, v in c.cascade.items()})
          for c in ladder(plans=True)]
    assert ids(policy(cs, mode="cascade").plan(Budget())) == ["w100"]


def with_targets(cs, targets):
    """The ladder's plans with one plan per target accuracy: target -> (threshold, coverage)."""
    return [dataclasses.replace(c, cascade={k: {**v, "targets": {
        t: {"threshold": th, "coverage": cov} for t, (th, cov) in targets.items()}}
        for k, v in c.cascade.items()}) for c in cs]


@pytest.mark.parametrize("target, accept", [("0.9", 0.3), ("0.95", 0.6), ("0.99", 0.95)])
def test_the_target_accuracy_picks_its_own_plan(target, accept):
    cs = with_targets(ladder(plans=True), {"0.9": (0.3, 0.97), "0.95": (0.6, 0.9),
                                           "0.99": (0.95, 0.4)})
    plan = policy(cs, mode="cascade", target=target).plan(Budget())
    assert ids(plan) == ["w025", "w100"] and plan.stages[0].accept == accept


def test_a_target_without_a_plan_of_its_own_takes_the_plan_s_threshold():
    cs = with_targets(ladder(plans=True), {"0.99": (0.95, 0.4)})
    plan = policy(cs, mode="cascade", target="0.9").plan(Budget())
    assert plan.stages[0].accept == 0.7  # the version-7 plan's one threshold


def test_the_plan_is_chosen_on_interpreter_figures_not_on_noise():
    """Measured end to end, the first stages' costs differ by less than their noise: the
    plan stays the one the interpreter figures rank first (w025: 1 + 0.1 x 8 ms) whatever
    this process measured, while its stages fit the budget; a first stage measured over the
    budget (twice: sustained) is passed over for the next plan."""
    pol = policy(ladder(plans=True), mode="cascade")
    for ms in (9.0, 9.0, 9.5, 9.2):  # w025 measured slower than w050, within the budget
        pol.observe("w025", ms)
        pol.observe("w050", 3.0)
        assert ids(pol.plan(Budget(latency_ms=20.0))) == ["w025", "w100"]
    pol.observe("w025", 30.0)
    assert ids(pol.plan(Budget(latency_ms=20.0))) == ["w025", "w100"]  # one outlier
    for _ in range(10):  # sustained: the estimate follows it over the budget
        pol.observe("w025", 30.0)
    assert ids(pol.plan(Budget(latency_ms=20.0))) == ["w050", "w100"]


def test_the_cascade_pairs_precisions_as_its_plans_were_fitted():
    """The final network's variants (float, int8) each have plans from the narrow width at
    their own precision: the cheapest pair runs, even when the answering variant alone is
    the other precision."""
    def var(cid, width, nll, ms, weights, wider=None, cov=0.9):
        c = dataclasses.replace(config(cid, width=width, val_nll=nll, latency_ms=ms),
                                weights=weights)
        if wider:
            c = dataclasses.replace(c, cascade={wider: {"threshold": 0.8, "coverage": cov,
                                                        "max_loss": 0.002}})
        return c
    cs = [var("w100", 1.0, 0.2, 4.0, "dequantize"), var("w100-int8", 1.0, 0.2, 4.5, "int8"),
          var("w025", 0.25, 0.5, 3.0, "dequantize", "w100"),
          var("w025-int8", 0.25, 0.5, 0.5, "int8", "w100-int8")]
    pol = policy(cs, mode="cascade")
    assert pol.active_variant(cs[0]).id == "w100"  # the float variant answers alone
    # float pair 3 + 0.1 x 4 = 3.4; int8 pair 0.5 + 0.1 x 4.5 = 0.95
    assert ids(pol.plan(Budget())) == ["w025-int8", "w100-int8"]


def test_without_plans_the_cascade_climbs_the_fitting_widths():
    pol = policy(ladder(plans=False), mode="cascade")
    plan = pol.plan(Budget())
    assert ids(plan) == ["w025", "w050", "w100"]
    assert [s.accept for s in plan.stages] == [0.6, 0.7, None]
    assert ids(pol.plan(Budget(latency_ms=3.0))) == ["w025", "w050"]  # w100 does not fit


def test_climb_only_ignores_the_plans_and_a_missing_threshold_always_escalates():
    cs = ladder(plans=True)
    cs[0] = dataclasses.replace(cs[0], thresholds={"0.95": None})
    pol = policy(cs, mode="cascade")
    pol.climb_only = True
    plan = pol.plan(Budget())
    assert ids(plan) == ["w025", "w050", "w100"] and plan.stages[0].accept == math.inf


def test_preview_changes_no_state_and_plan_does():
    pol = policy(ladder(plans=False))
    assert pol.preview(Budget()).stages == pol.preview(Budget()).stages
    assert (pol._calls, pol._last) == (0, None)
    pol.plan(Budget())
    assert (pol._calls, pol._last) == (1, "w100")


def test_strict_plans_raise_with_the_shortfall():
    pol = policy(ladder(plans=False))
    with pytest.raises(BudgetNotMetError, match=r"fastest, w025, is predicted at 1 ms"):
        pol.plan(Budget(latency_ms=0.5), strict=True)


def test_a_batch_is_planned_on_its_own_predicted_latency():
    pol = policy(ladder(plans=False))
    assert ids(pol.plan(Budget(latency_ms=10.0))) == ["w100"]
    # 4 samples: unmeasured, a batch is predicted as 4 single calls (32 ms for w100)
    assert ids(pol.plan(Budget(latency_ms=10.0), n=4)) == ["w050"]
    pol.observe("w100", 9.0, n=4)  # measured: the batch of 4 takes 9 ms (held, then
    pol.observe("w100", 9.0, n=4)  # confirmed: median(prior 32, 9, 9))
    assert ids(pol.plan(Budget(latency_ms=10.0), n=4)) == ["w100"]


def test_a_measured_batch_size_sets_the_prior_of_the_others_at_that_size():
    """Batches of n cost what n single calls cost times the ratio measured at n on this
    device (any configuration's), until a configuration is measured at n itself."""
    pol = policy(ladder(plans=False))
    by_id = {c.id: c for c in pol.configs}
    single = {cid: pol.predicted_latency_ms(c) for cid, c in by_id.items()}
    assert pol.predicted_latency_ms(by_id["w050"], 64) == pytest.approx(64 * single["w050"])
    for _ in range(2):  # a batch of 64 on w100 takes 3x 64 single calls here
        pol.observe("w100", 3 * 64 * single["w100"], n=64)
    for cid in ("w025", "w050"):
        assert pol.predicted_latency_ms(by_id[cid], 64) == pytest.approx(3 * 64 * single[cid])
    assert pol.predicted_latency_ms(by_id["w050"], 8) == pytest.approx(8 * single["w050"])


@pytest.mark.parametrize("kw", [{"hysteresis": 1.0}, {"hysteresis": -0.5},
                                {"half_life_s": -1}, {"half_life_calls": 0},
                                {"ewma": 0}, {"mode": "fastest"}], ids=repr)
def test_tunables_are_validated(kw):
    name = next(iter(kw))
    with pytest.raises(ConfigError, match="policy must be" if name == "mode" else name):
        policy(ladder(plans=False), **kw)


def test_the_memory_cap_is_a_memory_limit_of_every_decision():
    cs = [dataclasses.replace(c, memory_mb=m) for c, m in zip(ladder(False), (1.0, 2.0, 5.0))]
    pol = policy(cs, memory_cap_mb=3.0)
    assert ids(pol.plan(Budget())) == ["w050"]
    assert pol.memory_limit_mb(Budget(memory_mb=10)) == 3.0


# ------------------------------------------- (issue 34) call_stages' fast path equals plan()
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=1000, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["w025", "w050", "w100"]),
                                 st.floats(0.1, 20.0), st.floats(0.0, 10.0)), max_size=8),
       latencies=st.lists(st.one_of(st.none(), st.floats(0.1, 12.0)), min_size=3,
                          max_size=3),
       memory=st.floats(0.5, 10.0), calls=st.integers(0, 300), now=st.floats(0.0, 20.0),
       incumbent=st.one_of(st.none(), st.sampled_from(["w025", "w050", "w100", "gone"])),
       hysteresis=st.sampled_from([0.0, 0.1, 0.5]),
       between=st.lists(st.tuples(st.sampled_from(["w025", "w050", "w100"]),
                                  st.floats(0.1, 20.0)), min_size=3, max_size=3))
def test_call_stages_answers_what_plan_answers(events, latencies, memory, calls, now,
                                               incumbent, hysteresis, between):
    """Whatever the measurements (ages in seconds and in decisions), the budgets, the
    incumbent and the hysteresis, the runtime's cheap call_stages (its inlined prediction,
    the floor it rules configurations out by, its one-pass hysteresis) executes the stages
    plan() makes, and records the same decision."""
    cs = [dataclasses.replace(c, memory_mb=m) for c, m in zip(ladder(plans=False), (1, 2, 4))]
    pols = []
    for _ in range(2):
        clock = FakeClock()
        pol = Policy(cs, MemoryProbe(reader=lambda: 1e9, clock=FakeClock()), clock=clock,
                     hysteresis=hysteresis)
        for cid, ms, t in events:
            clock.t = t
            pol.observe(cid, ms)
            pol._calls += 7
        pol._calls += calls
        clock.t = max([t for _, _, t in events] + [0.0]) + now
        pol._last = incumbent  # (an id no configuration has: a bundle's configurations changed)
        pols.append(pol)
    fast, slow = pols
    # the budget moves between calls: an incumbent chosen under another budget, a better
    # configuration inside or outside the hysteresis headroom; each budget twice, with a
    # measurement in between (call_stages' candidates kept, or dropped by a lower floor)
    for latency, (cid, ms) in zip(latencies, between):
        budget = Budget(latency_ms=latency, memory_mb=memory)
        for again in (False, True):
            assert [s.config.id for s in fast.call_stages(budget)] == ids(slow.plan(budget))
            assert (fast._last, fast._calls) == (slow._last, slow._calls)
            if not again:
                fast.observe(cid, ms)
                slow.observe(cid, ms)


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["w025", "w050", "w100"]),
                                 st.floats(0.001, 50.0), st.floats(0.0, 100.0)), max_size=12),
       calls=st.integers(0, 5000), later=st.floats(0.0, 1000.0))
def test_floor_bounds_every_prediction(events, calls, later):
    """The floor call_stages rules a configuration out by never exceeds its prediction, at
    any age of its measurements (in seconds and in decisions)."""
    clock = FakeClock()
    pol = Policy(ladder(plans=False), MemoryProbe(reader=lambda: 1e9, clock=FakeClock()),
                 clock=clock)
    for cid, ms, t in sorted(events, key=lambda e: e[2]):
        clock.t = t
        pol.observe(cid, ms)
        pol._calls += 3
    pol._calls += calls
    clock.t += later
    for c in pol.configs:
        assert pol._floor[c.id] <= pol.predicted_latency_ms(c)
