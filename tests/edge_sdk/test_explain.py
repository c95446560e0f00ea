"""Issue 19 §5: EdgeModel.explain() is the decision table the policy uses (per configuration:
predicted end-to-end latency and its source, first-use cost, memory need, fits, quality rank;
the choice and the reason), and reading it changes nothing. Real bundle, no torch."""
from __future__ import annotations

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import BudgetError
from edge_sdk.policy.budget import Budget

PLENTY_MB = 1e6


@pytest.fixture
def m(bundle):
    return edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)


@pytest.fixture
def x(m):
    lo, hi = m.input_spec.value_range
    return np.full(m.input_spec.shape[1:], (lo + hi) / 2, np.float32)


def row(exp, cid):
    return next(r for r in exp.rows if r.config_id == cid)


def test_every_configuration_has_a_row_in_the_rules_order(m):
    exp = m.explain()
    assert [r.config_id for r in exp.rows] == [c.id for c in m.policy.ranked]
    assert [r.quality_rank for r in exp.rows] == list(range(1, len(exp.rows) + 1))
    assert sum(r.chosen for r in exp.rows) == 1 and row(exp, exp.chosen).chosen


def test_the_explained_choice_is_what_predict_then_does(m, x):
    for budget in (Budget(), Budget(memory_mb=min(
            m.policy.memory_need_mb(c) for c in m.manifest.configurations) * 1.001)):
        exp = m.explain(budget)
        assert m.predict(x, budget).config_id == exp.chosen


def test_explaining_changes_no_state(m):
    calls, last = m.policy._calls, m.policy._last
    for _ in range(5):
        m.explain(Budget(latency_ms=1e-3))
    assert (m.policy._calls, m.policy._last) == (calls, last)


def test_fits_follow_the_predicted_latency_and_memory(m):
    preds = sorted(m.policy.predicted_latency_ms(c) for c in m.manifest.configurations)
    budget = Budget(latency_ms=(preds[0] + preds[-1]) / 2)
    exp = m.explain(budget)
    for r in exp.rows:
        assert r.fits_latency == (r.predicted_ms <= budget.latency_ms)
        assert r.fits_memory and r.fits == r.fits_latency
    chosen = row(exp, exp.chosen)
    assert chosen.fits and all(not r.fits for r in exp.rows
                               if r.quality_rank < chosen.quality_rank)
    assert "quality rank" in exp.reason


def test_nothing_fits_is_explained_with_the_shortfall(m):
    exp = m.explain(Budget(latency_ms=1e-9))
    assert not exp.fits and not any(r.fits for r in exp.rows)
    assert "no configuration fits latency" in exp.reason and "ms over" in exp.reason
    exp = m.explain(Budget(memory_mb=1e-6))
    assert "MB short" in exp.reason and not any(r.fits_memory for r in exp.rows)


def test_the_source_says_where_each_prediction_comes_from(m, x, bundle):
    c = m.manifest.configurations[0]
    assert row(m.explain(), c.id).source.startswith("manifest") or \
        row(m.explain(), c.id).source.startswith("MACs fallback")
    assert row(m.explain(), c.id).first_use_ms is None
    m.predict(x, config_id=c.id)
    assert not row(m.explain(), c.id).source.startswith("measured")  # the first is held
    m.predict(x, config_id=c.id)
    r = row(m.explain(), c.id)
    assert r.source == "measured EWMA" and r.first_use_ms is not None and r.first_use_ms > 0
    assert r.predicted_ms == pytest.approx(m.policy.predicted_latency_ms(c))
    prof = edge_sdk.load(bundle, profile="raspberry_pi_4", memory_reader=lambda: PLENTY_MB)
    assert "raspberry_pi_4" in row(prof.explain(), c.id).source


def test_hysteresis_is_named_when_it_keeps_the_incumbent(m, x):
    best, other = m.policy.ranked[:2]
    for _ in range(2):  # measured (twice: one alone is held): best 1 ms, the runner-up 0.5
        m.policy.observe(best.id, 1.0)
        m.policy.observe(other.id, 0.5)
    m.policy._last = other.id  # the incumbent; best fits 1.01 ms, but not with 10 % headroom
    exp = m.explain(Budget(latency_ms=1.01))
    assert exp.chosen == other.id and "hysteresis" in exp.reason and best.id in exp.reason
    assert m.explain(Budget(latency_ms=1.2)).chosen == best.id  # with headroom: replaced


def test_explain_is_text_and_data(m):
    exp = m.explain(Budget(latency_ms=1.0))
    text = str(exp)
    assert "latency 1 ms" in text and f"chosen: {exp.chosen}" in text
    assert all(r.config_id in text for r in exp.rows)
    d = exp.to_dict()
    assert d["chosen"] == exp.chosen and {"fits", "source", "predicted_ms"} <= set(d["rows"][0])


def test_a_cascade_plan_marks_its_stages(bundle):
    m = edge_sdk.load(bundle, policy="cascade", memory_reader=lambda: PLENTY_MB)
    exp = m.explain()
    staged = [r for r in exp.rows if r.stage is not None]
    plan = m.policy.preview(Budget())
    assert len(staged) == (len(plan.stages) if len(plan.stages) > 1 else 0)


def test_explain_takes_only_a_budget(m):
    with pytest.raises(BudgetError):
        m.explain(3)
