"""EdgeModel._answer (the inlined softmax / entropy / MI on the hot path) against
edge_sdk.answers.metrics, and pinned predict() feeding the latency EWMA. Real bundle, no torch."""
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
from edge_sdk.answers import metrics as M
from edge_sdk.policy.budget import Budget, MemoryProbe
from edge_sdk.policy.policy import Policy

PLENTY_MB = 1e6


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)


def reference(logits: np.ndarray, temperature: float):
    """probs [C], predictive entropy and MI, by edge_sdk.answers.metrics in float64."""
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
    assert m.policy.predicted_latency_ms(target) == priors[target.id]  # the first is held
    m.predict(x, config_id=target.id)  # the second confirms it
    assert m.policy.predicted_latency_ms(target) == pytest.approx(7.0)
    for c in configs:  # the others keep their prior
        if c.id != target.id:
            assert m.policy.predicted_latency_ms(c) == priors[c.id]

    timer.step = 12.0 / 1000 / target.invokes
    m.predict(x, config_id=target.id)  # one call at 12 ms: median(7, 7, 12) leaves it
    assert m.policy.predicted_latency_ms(target) == pytest.approx(7.0)
    m.predict(x, config_id=target.id)  # two: the EWMA moves a fifth of the way
    assert m.policy.predicted_latency_ms(target) == pytest.approx(0.8 * 7.0 + 0.2 * 12.0)


def test_a_slow_pinned_run_steers_the_next_unpinned_choice(bundle):
    m = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    timer = invoke_clock(m, 1.0)._clock
    m.policy = Policy(m.manifest.configurations, MemoryProbe(lambda: PLENTY_MB),
                      clock=FakeClock())
    x = np.zeros(tuple(m.manifest.input.shape[1:]), np.float32)
    budget = Budget(latency_ms=1e3)  # every prior fits
    first = m.policy.choose(budget)[0].id
    timer.step = 1e5 / 1000  # pinned, measured far over the budget: once is an outlier,
    m.predict(x, config_id=first)
    timer.step = 1.0 / 1000
    assert m.policy.choose(budget)[0].id == first
    timer.step = 1e5 / 1000  # twice in a row is the device
    m.predict(x, config_id=first)
    m.predict(x, config_id=first)
    timer.step = 1.0 / 1000
    assert m.predict(x, budget).config_id != first


# ------------------------------------------------- (issue 34) probs and entropy when read


def _lean(model, c, logits):
    from edge_sdk.answers.maths import point_top, rows_top
    from edge_sdk.answers.prediction import lean_answer

    if len(logits) == 1:
        label, conf, lazy = point_top(c, logits)
        probs = None
    else:
        probs, label, conf, lazy = rows_top(c, logits)
    return lean_answer(c, model.manifest.labels, label, conf, lazy, False, 1.0, 0.5, True, None,
                       probs)


@given(logits=st.one_of(hnp.arrays(np.float32, (1, CLASSES), elements=finite),
                        hnp.arrays(np.float32, (4, CLASSES), elements=finite)),
       t=temperatures)
def test_a_lean_answer_equals_the_eager_one_bit_for_bit(model, logits, t):
    from edge_sdk.answers.maths import probabilities

    c = dataclasses.replace(model.manifest.configurations[0], temperature=t)
    probs, entropy, mi, label, conf = probabilities(c, logits)
    lean = _lean(model, c, logits)
    assert (lean.label, lean.confidence) == (label, conf)
    lazy = {"probs", "entropy"} if len(logits) == 1 else {"entropy", "mutual_info"}
    assert not lazy & set(vars(lean))  # not computed until read
    assert np.array_equal(lean.probs, np.array(probs))
    assert (lean.entropy, lean.mutual_info) == (entropy, mi)
    assert not lean.probs.flags.writeable
    ref_p, ref_h, ref_mi = reference(logits, t)  # and both agree with edge_sdk.answers.metrics
    np.testing.assert_allclose(lean.probs, ref_p, rtol=0, atol=1e-12)
    assert lean.entropy == pytest.approx(ref_h, abs=1e-9)
    assert lean.mutual_info == pytest.approx(ref_mi, abs=1e-9)


def test_a_row_that_underflows_under_the_global_shift_takes_the_exact_path(model):
    """Rows 1,600 apart at T = 0.1: shifted by the global maximum the low row's exps are all
    0, so rows_top declines and probabilities() shifts each row by its own maximum."""
    from edge_sdk.answers.maths import rows_top

    logits = np.array([[80.0] + [0.0] * (CLASSES - 1), [-80.0] * CLASSES], np.float32)
    c = dataclasses.replace(model.manifest.configurations[0], temperature=0.1)
    assert rows_top(c, logits) is None
    ans = check(model, logits, 0.1)  # against edge_sdk.answers.metrics
    assert ans.label == 0


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_lean_answer_refuses_non_finite_logits_at_once(model, bad, rows):
    from edge_sdk.errors import OutputError

    logits = np.zeros((rows, CLASSES), np.float32)
    logits[-1, 3] = bad
    with pytest.raises(OutputError, match="answered non-finite values"):
        _lean(model, model.manifest.configurations[0], logits)


@pytest.mark.parametrize("scope", ["point", "head"])
def test_a_lazy_prediction_behaves_as_any_prediction(bundle, scope):
    import copy
    import pickle

    eager = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    lean = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB,
                         uncertainty=False)
    cfg = next(c for c in lean.manifest.configurations if c.scope == scope)
    x = np.random.default_rng(0).uniform(*lean.manifest.input.value_range,
                                         lean.manifest.input.shape[1:]).astype(np.float32)
    a, b = eager.predict(x, config_id=cfg.id), lean.predict(x, config_id=cfg.id)
    assert "_lazy" in vars(b) and "_lazy" in vars(a)
    # none of the three is made until read (a head's probs too: its graph computed them),
    # nor the prediction set; the OOD verdict is (abstain needs it)
    assert not {"probs", "entropy", "mutual_info"} & set(vars(b))
    assert not {"probs", "entropy", "mutual_info", "prediction_set"} & set(vars(a))
    assert a.ood_score is not None and a.in_distribution is not None
    assert a.label in a.prediction_set and "_lazy" not in vars(a)
    q = eager.uncertainty.qhat(cfg.id, eager.conformal, eager.alpha)
    assert a.prediction_set == eager.uncertainty.set_one(a.probs.tolist(), q, "lac", a.label)
    fresh = lean.predict(x, config_id=cfg.id)
    for got in (pickle.loads(pickle.dumps(fresh)), copy.copy(fresh), copy.deepcopy(fresh)):
        assert np.array_equal(got.probs, a.probs)
        assert (got.entropy, got.mutual_info) == (a.entropy, a.mutual_info)
    assert np.array_equal(b.probs, a.probs)
    assert (b.entropy, b.mutual_info) == (a.entropy, a.mutual_info)
    assert "_lazy" not in vars(b)  # computed once, then plain attributes
    same = dataclasses.replace(b, latency_ms=a.latency_ms, invoke_ms=a.invoke_ms,
                               ood_score=a.ood_score, in_distribution=a.in_distribution,
                               prediction_set=a.prediction_set, abstain=a.abstain)
    assert same == a and hash(same) == hash(a)
    assert b.to_dict()["probs"] == a.probs.tolist()
    assert "entropy=" in repr(fresh)
    with pytest.raises(AttributeError, match="has no attribute 'lable'"):
        fresh.lable  # noqa: B018
