"""EdgeModel._answer (the inlined softmax / entropy / MI on the hot path) against
edge_sdk.metrics, and pinned predict() feeding the latency EWMA. Real bundle, no torch."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from runtime_support import invoke_clock
from test_policy import FakeClock

import edge_sdk
from edge_sdk import metrics as M
from edge_sdk.policy import Budget, MemoryProbe, Policy

PLENTY_MB = 1e6


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)


def reference(logits: np.ndarray, temperature: float):
    """probs [C], predictive entropy and MI, by edge_sdk.metrics in float64."""
    p_s = M.softmax(logits.astype(np.float64), temperature=temperature)  # [S, C]
    per_input = p_s[:, None, :]  # [S, N=1, C]
    return (p_s.mean(0), float(M.predictive_entropy(per_input)[0]),
            float(M.mutual_information(per_input)[0]))


def check(model, logits: np.ndarray, temperature: float):
    base = model.manifest.configurations[0]
    c = dataclasses.replace(base, temperature=temperature)
    ans = model._answer(c, logits, 1.25, True)
    probs, entropy, mi = reference(logits, temperature)
    got = np.asarray(ans.probs)
    assert got.shape == probs.shape
    np.testing.assert_allclose(got, probs, rtol=0, atol=1e-12)
    assert math.fsum(ans.probs) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 <= v <= 1.0 for v in ans.probs)
    assert ans.entropy == pytest.approx(entropy, abs=1e-9)
    assert 0.0 <= ans.entropy <= math.log(len(ans.probs)) + 1e-12
    assert ans.mutual_info == pytest.approx(mi, abs=1e-9)
    assert 0.0 <= ans.mutual_info <= ans.entropy + 1e-12
    assert ans.probs[ans.label] == max(ans.probs) == ans.confidence
    assert ans.class_name == model.manifest.labels[ans.label]
    assert ans.abstain == (ans.confidence < c.thresholds[model._target_key])
    assert (ans.config_id, ans.latency_ms, ans.budget_met) == (c.id, 1.25, True)
    return ans


CLASSES = 10
finite = st.floats(-80, 80, width=32, allow_nan=False, allow_infinity=False)
temperatures = st.floats(0.3, 3.0)


@given(logits=hnp.arrays(np.float32, (1, CLASSES), elements=finite), t=temperatures)
def test_one_sample_answer_matches_metrics(model, logits, t):
    ans = check(model, logits, t)
    assert ans.mutual_info == 0.0  # a point prediction has no epistemic part


@given(logits=hnp.arrays(np.float32, (4, CLASSES), elements=finite), t=temperatures)
def test_four_sample_answer_matches_metrics(model, logits, t):
    check(model, logits, t)


@given(row=hnp.arrays(np.float32, (CLASSES,), elements=finite), t=temperatures)
def test_identical_samples_have_no_mutual_information(model, row, t):
    one = check(model, row[None], t)
    four = check(model, np.repeat(row[None], 4, 0), t)
    assert four.mutual_info == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(four.probs, one.probs, atol=1e-12)
    assert four.entropy == pytest.approx(one.entropy, abs=1e-9)


@pytest.mark.parametrize("logits", [
    np.zeros((1, CLASSES), np.float32),  # uniform: entropy log C
    np.full((4, CLASSES), 80.0, np.float32),
    np.array([[80.0] + [-80.0] * (CLASSES - 1)], np.float32),  # one-hot to machine precision
    np.array([[80.0] + [-80.0] * (CLASSES - 1),
              [-80.0] + [80.0] + [-80.0] * (CLASSES - 2)] * 2, np.float32),  # total disagreement
])
@pytest.mark.parametrize("t", [0.3, 1.0, 3.0])
def test_extreme_logits(model, logits, t):
    ans = check(model, logits, t)
    if np.ptp(logits) == 0:
        assert ans.entropy == pytest.approx(math.log(CLASSES), abs=1e-12)


def test_disagreeing_samples_have_mutual_information_log_two(model):
    a = [80.0] + [-80.0] * (CLASSES - 1)
    b = [-80.0, 80.0] + [-80.0] * (CLASSES - 2)
    ans = check(model, np.array([a, b, a, b], np.float32), 1.0)
    assert ans.mutual_info == pytest.approx(math.log(2), abs=1e-9)


# --------------------------------------------------------------------------- pinned predict


def test_pinned_predict_feeds_the_policys_latency_estimate(bundle):
    m = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    m.policy = Policy(m.manifest.configurations, MemoryProbe(lambda: PLENTY_MB),
                      clock=FakeClock())  # the policy's own clock frozen: no ageing
    configs = m.manifest.configurations
    priors = {c.id: m.policy.predicted_latency_ms(c) for c in configs}
    assert all(priors[c.id] == m.policy.prior_latency_ms(c) + m.policy.overhead_ms(c)
               for c in configs)  # end to end: the invoke prior plus the SDK's own time
    target = max(configs, key=lambda c: c.invokes)  # several invokes, one call
    timer = invoke_clock(m, 7.0 / target.invokes)._clock  # the call takes 7 ms in all
    x = np.zeros(tuple(m.manifest.input.shape[1:]), np.float32)

    p = m.predict(x, config_id=target.id)
    assert p.config_id == target.id and p.latency_ms == pytest.approx(7.0)
    assert m.policy.predicted_latency_ms(target) == pytest.approx(7.0)
    for c in configs:  # the others keep their prior
        if c.id != target.id:
            assert m.policy.predicted_latency_ms(c) == priors[c.id]

    timer.step = 12.0 / 1000 / target.invokes
    m.predict(x, config_id=target.id)
    assert m.policy.predicted_latency_ms(target) == pytest.approx(0.8 * 7.0 + 0.2 * 12.0)


def test_a_slow_pinned_run_steers_the_next_unpinned_choice(bundle):
    m = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    timer = invoke_clock(m, 1.0)._clock
    m.policy = Policy(m.manifest.configurations, MemoryProbe(lambda: PLENTY_MB),
                      clock=FakeClock())
    x = np.zeros(tuple(m.manifest.input.shape[1:]), np.float32)
    budget = Budget(latency_ms=1e3)  # every prior fits
    first = m.policy.choose(budget)[0].id
    timer.step = 1e5 / 1000  # its first measurement, pinned, is far over the budget
    m.predict(x, config_id=first)
    timer.step = 1.0 / 1000
    assert m.predict(x, budget).config_id != first
