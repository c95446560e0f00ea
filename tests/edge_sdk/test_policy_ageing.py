"""edge_sdk.policy.policy: measured latencies age toward the prior (half-life), on a fake clock.

Pure unit tests on fake configurations (helpers from test_policy). No torch.
"""
from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from test_policy import FakeClock, config, policy

from edge_sdk.policy.budget import Budget

HALF_LIFE = 10.0


def aged(prior: float = 2.0, measured: float = 10.0, **kw):
    clock = FakeClock(100.0)
    c = config("c", latency_ms=prior)
    p = policy([c], clock=clock, half_life_s=HALF_LIFE, **kw)
    settle(p, "c", measured)
    return p, c, clock


def settle(p, cid: str, ms: float) -> None:
    """Two equal measurements: the estimate becomes ``ms`` (one alone is held)."""
    p.observe(cid, ms)
    p.observe(cid, ms)


def test_a_fresh_measurement_is_the_prediction():
    p, c, clock = aged()
    assert p.predicted_latency_ms(c) == 10.0
    clock.t += 0.001  # a millisecond later: still the measurement
    assert p.predicted_latency_ms(c) == pytest.approx(10.0, rel=1e-5)


@given(prior=st.floats(0.01, 1e4), measured=st.floats(0.01, 1e4),
       half_life=st.floats(0.5, 1000))
def test_after_one_half_life_the_prediction_is_halfway_to_the_prior(prior, measured, half_life):
    clock = FakeClock(0.0)
    c = config("c", latency_ms=prior)
    p = policy([c], clock=clock, half_life_s=half_life)
    settle(p, "c", measured)
    clock.t = half_life
    assert p.predicted_latency_ms(c) == pytest.approx((prior + measured) / 2, rel=1e-12)
    clock.t = 2 * half_life  # two half-lives: a quarter of the way left
    assert p.predicted_latency_ms(c) == pytest.approx(prior + (measured - prior) / 4, rel=1e-9)


def test_after_many_half_lives_the_prediction_is_the_prior():
    p, c, clock = aged(prior=2.0, measured=10.0)
    clock.t += 50 * HALF_LIFE
    assert p.predicted_latency_ms(c) == pytest.approx(2.0, rel=1e-9)


@given(steps=st.lists(st.floats(0.01, 30), min_size=1, max_size=20))
def test_ageing_moves_monotonically_toward_the_prior(steps):
    p, c, clock = aged(prior=2.0, measured=10.0)
    last = p.predicted_latency_ms(c)
    for dt in steps:
        clock.t += dt
        now = p.predicted_latency_ms(c)
        assert 2.0 <= now <= last
        last = now


def test_ageing_pulls_a_fast_measurement_back_up_to_the_prior_too():
    p, c, clock = aged(prior=8.0, measured=1.0)
    clock.t += HALF_LIFE
    assert p.predicted_latency_ms(c) == pytest.approx(4.5)


def test_the_prior_used_by_ageing_is_the_profile_prior_when_given():
    clock = FakeClock(0.0)
    c = config("c", latency_ms=2.0)
    p = policy([c], clock=clock, half_life_s=HALF_LIFE, priors={"c": 6.0})
    assert p.prior_latency_ms(c) == 6.0
    settle(p, "c", 10.0)
    clock.t = HALF_LIFE
    assert p.predicted_latency_ms(c) == pytest.approx(8.0)


def test_a_configuration_shunned_after_a_transient_is_chosen_again_once_its_measurement_ages():
    """The "never refreshes" bug: measured slow once (another app, thermal throttling), the
    best configuration must not stay excluded for good after the transient is over."""
    clock = FakeClock(0.0)
    best = config("best", width=1.0, val_nll=0.1, latency_ms=3.0)
    fallback = config("fallback", width=0.5, val_nll=0.5, latency_ms=1.0)
    p = policy([best, fallback], clock=clock, half_life_s=HALF_LIFE)
    budget = Budget(latency_ms=5.0)
    assert p.choose(budget)[0].id == "best"
    settle(p, "best", 40.0)  # the transient
    clock.t += 1.0
    assert p.choose(budget)[0].id == "fallback"
    # while the fallback runs, only it gets measured
    for _ in range(5):
        clock.t += 1.0
        p.observe("fallback", 1.0)
        assert p.choose(budget)[0].id == "fallback"
    clock.t += 10 * HALF_LIFE
    c, met = p.choose(budget)
    assert (c.id, met) == ("best", True)


def test_without_time_passing_the_transient_keeps_the_configuration_out():
    clock = FakeClock(0.0)
    best = config("best", width=1.0, val_nll=0.1, latency_ms=3.0)
    fallback = config("fallback", width=0.5, val_nll=0.5, latency_ms=1.0)
    p = policy([best, fallback], clock=clock, half_life_s=HALF_LIFE)
    settle(p, "best", 40.0)
    for _ in range(100):
        assert p.choose(Budget(latency_ms=5.0))[0].id == "fallback"


def test_a_fresh_observation_moves_by_the_ewma_factor():
    p, c, _clock = aged(prior=2.0, measured=10.0)
    p.observe("c", 20.0)  # one measurement alone: median(10, 10, 20) leaves it
    assert p.predicted_latency_ms(c) == pytest.approx(10.0)
    p.observe("c", 20.0)  # no time passed: plain EWMA, 0.2 toward the median (20)
    assert p.predicted_latency_ms(c) == pytest.approx(0.8 * 10.0 + 0.2 * 20.0)


@given(gap=st.floats(0.0, 200.0), first=st.floats(0.1, 100), second=st.floats(0.1, 100))
def test_a_late_observation_is_held_then_followed(gap, first, second):
    """After any gap, one measurement alone leaves the (aged) belief; a second one confirms
    it: the fresh estimate moves a fifth of the way toward it (capped at twice itself), or,
    past ten half-lives (the prior weighs > 0.999), takes it as a first estimate does."""
    prior = 2.0
    p, c, clock = aged(prior=prior, measured=first)
    clock.t += gap
    before = p.predicted_latency_ms(c)  # what the policy believed just before
    assume(abs(gap - 10 * HALF_LIFE) > 1e-6)  # (the clock's rounding at the boundary)
    forgotten = gap > 10 * HALF_LIFE
    p.observe("c", second)
    assert p.predicted_latency_ms(c) == pytest.approx(prior if forgotten else before, rel=1e-9)
    p.observe("c", second)
    after = p.predicted_latency_ms(c)
    if forgotten:
        assert after == pytest.approx(sorted([prior, second, second])[1], rel=1e-9)
    else:
        assert after == pytest.approx(before + 0.2 * (min(second, 2 * before) - before),
                                      rel=1e-9)


@given(gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=30),
       measured=st.lists(st.floats(0.01, 100), min_size=30, max_size=30),
       decisions=st.lists(st.integers(0, 2), min_size=30, max_size=30),
       ewma=st.sampled_from([0.2, 1e-4]), half_life_calls=st.sampled_from([200, 2000]))
def test_observe_s_shortcuts_are_the_full_ageing_rule(gaps, measured, decisions, ewma,
                                                      half_life_calls):
    """(issue 34) observe() skips the ageing maths while an estimate is younger than the age
    at which the prior would weigh min(1e-3, ewma) and no decision was made since, and takes
    the ageing of exactly one decision when one was made since and the time since is worth
    less: the same estimates as the full rule (a policy whose shortcuts never apply),
    outlier cap included. (half_life_calls 2000: one decision weighs the prior under 1e-3.)"""
    clocks = [FakeClock(100.0), FakeClock(100.0)]
    c = config("c", latency_ms=2.0)
    fast, full = (policy([c], clock=k, half_life_s=HALF_LIFE, ewma=ewma,
                         half_life_calls=half_life_calls) for k in clocks)
    full._fresh_s = -1.0  # never fresh: always the full rule
    full._one_call_age = -1.0  # never aged by exactly one decision: the full rule
    assert fast._fresh_s > 0 and fast._one_call_age > 0
    for gap, ms, made in zip(gaps, measured, decisions):
        for p, k in ((fast, clocks[0]), (full, clocks[1])):
            k.t += gap
            p._calls += made  # decisions in between (policy-chosen calls)
            p.observe("c", ms)
        assert fast.predicted_latency_ms(c) == full.predicted_latency_ms(c)


def test_a_very_stale_estimate_is_replaced_by_the_new_measurement():
    p, c, clock = aged(prior=2.0, measured=100.0)
    clock.t += 100 * HALF_LIFE
    p.observe("c", 3.0)  # forgotten: measured afresh, the first measurement held
    assert p.predicted_latency_ms(c) == pytest.approx(2.0, rel=1e-9)
    p.observe("c", 3.0)  # median(prior, 3, 3)
    assert p.predicted_latency_ms(c) == pytest.approx(3.0, rel=1e-9)
    # and it is fresh again: ageing restarts from the new observation
    clock.t += HALF_LIFE
    assert p.predicted_latency_ms(c) == pytest.approx((3.0 + 2.0) / 2, rel=1e-9)


def test_observation_after_one_half_life_weighs_the_measurement_by_half():
    p, c, clock = aged(prior=2.0, measured=10.0)
    clock.t += HALF_LIFE
    p.observe("c", 30.0)  # alone against the aged estimate (6) and measurements (6, 6)
    assert p.predicted_latency_ms(c) == pytest.approx(6.0)
    p.observe("c", 30.0)  # confirmed, fresh again: plain EWMA toward median(6, 30, 30),
    assert p.predicted_latency_ms(c) == pytest.approx(0.8 * 6.0 + 0.2 * 12.0)  # capped 2x


def test_measurements_also_age_by_decisions_made_without_time_passing():
    """A fast app makes hundreds of decisions a second: after `half_life_calls` of them the
    measurement is halfway to the prior even on a frozen clock."""
    p, c, _clock = aged(prior=2.0, measured=10.0, half_life_calls=50)
    for _ in range(50):
        p.choose(Budget())
    assert p.predicted_latency_ms(c) == pytest.approx(6.0, rel=1e-12)


def test_a_configuration_shunned_after_a_burst_is_retried_after_enough_decisions():
    clock = FakeClock(0.0)
    best = config("best", width=1.0, val_nll=0.1, latency_ms=3.0)
    fallback = config("fallback", width=0.5, val_nll=0.5, latency_ms=1.0)
    p = policy([best, fallback], clock=clock, half_life_calls=100)
    settle(p, "best", 40.0)  # a burst: this process measured it far over the budget
    picks = [p.choose(Budget(latency_ms=5.0))[0].id for _ in range(1000)]
    first_retry = picks.index("best")
    assert 100 < first_retry < 1000 and set(picks[:first_retry]) == {"fallback"}
