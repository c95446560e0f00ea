"""edge_sdk.policy.estimates: one outlier measurement does not steer the policy, a sustained
change does, within 20 calls (the median of three before the EWMA).

Pure unit tests on fake configurations and a fake clock (helpers from test_policy). No torch.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_policy import FakeClock, config, policy

from edge_sdk.policy.budget import Budget

BUDGET = Budget(latency_ms=1.5)


def two():
    wide = config("wide", width=1.0, val_nll=0.1, latency_ms=1.0)
    narrow = config("narrow", width=0.5, val_nll=0.3, latency_ms=0.5)
    return policy([wide, narrow], clock=FakeClock()), wide, narrow


def run(p, latency_of, calls: int) -> list[str]:
    """The app's loop: the policy chooses, the call takes latency_of(id, i), it is observed."""
    out = []
    for i in range(calls):
        c, _ = p.choose(BUDGET)
        p.observe(c.id, latency_of(c.id, i))
        out.append(c.id)
    return out


@pytest.mark.parametrize("spike", [10.0, 1000.0])
@pytest.mark.parametrize("at", [0, 1, 5, 50])
def test_one_outlier_never_moves_the_choice(spike, at):
    """A first use the warm-up missed, a page fault, a GC pause: one call at 10-1000x, as
    the very first measurement (at=0: tested against the prior) or later."""
    p, wide, _ = two()
    picks = run(p, lambda cid, i: spike if i == at else 1.0, 100)
    assert picks == ["wide"] * 100
    assert p.predicted_latency_ms(wide) == pytest.approx(1.0)


def test_outliers_spaced_out_never_move_it_either():
    p, _, _ = two()
    picks = run(p, lambda cid, i: 50.0 if i % 3 == 0 else 1.0, 300)
    assert picks == ["wide"] * 300


@given(slowdown=st.floats(1.6, 100.0), start=st.integers(0, 60))
def test_a_sustained_slowdown_is_followed_within_20_calls(slowdown, start):
    """The device really slows down (over the budget of 1.5 ms): the policy moves to the
    configuration that fits within 20 calls of it starting, and stays there."""
    p, _, _ = two()
    picks = run(p, lambda cid, i: (slowdown if i >= start else 1.0) * (1.0 if cid == "wide"
                                                                        else 0.5), start + 40)
    assert picks[:start] == ["wide"] * start
    moved = picks.index("narrow", start)
    assert moved - start <= 20
    assert set(picks[moved:]) == {"narrow"} or slowdown * 0.5 > 1.5
