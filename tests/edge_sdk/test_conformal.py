"""Issue 33: split-conformal sets keep their coverage promise on synthetic data. Issue 51: the
non-empty rule (every set holds the top class) keeps it too, and numpy scalars are numbers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edge_sdk.answers import conformal as CF
from edge_sdk.errors import InputError
from edge_sdk.validation import real_value


def _data(rng, n, C=6):
    logits = rng.normal(0, 2, (n, C))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.array([rng.choice(C, p=row) for row in p])  # the model is calibrated by construction
    return p, y


@pytest.mark.parametrize("method", CF.METHODS)
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_marginal_coverage_over_many_splits(method, alpha):
    rng = np.random.default_rng(0)
    n_cal, n_test, reps = 200, 200, 60
    cov = []
    for _ in range(reps):
        p, y = _data(rng, n_cal + n_test)
        q = CF.calibrate(p[:n_cal], y[:n_cal], alpha, method)
        sets = CF.prediction_sets(p[n_cal:], q, method, nonempty=False)  # the textbook set
        cov.append(sets[np.arange(n_test), y[n_cal:]].mean())
    mean = float(np.mean(cov))
    # E[coverage] is in [1 - a, 1 - a + 1/(n+1)]; the mean of 60 runs has sd ~ 0.0025
    # (the upper bound is the plain set's: the non-empty rule may only add coverage)
    assert 1 - alpha - 0.01 <= mean <= 1 - alpha + 1 / (n_cal + 1) + 0.01


@pytest.mark.parametrize("method", ["aps", "raps"])
def test_randomised_scores_cover_and_shrink_sets(method):
    rng = np.random.default_rng(4)
    cov, size_r, size_d = [], [], []
    for _ in range(40):
        p, y = _data(rng, 600)
        p = p ** 3 / (p ** 3).sum(1, keepdims=True)  # confident, like a trained classifier
        y = np.array([rng.choice(p.shape[1], p=row) for row in p])
        q = CF.calibrate(p[:300], y[:300], 0.1, method, rng=rng)
        sets = CF.prediction_sets(p[300:], q, method, rng=rng, nonempty=False)
        cov.append(sets[np.arange(300), y[300:]].mean())
        size_r.append(sets.sum(1).mean())
        qd = CF.calibrate(p[:300], y[:300], 0.1, method)
        size_d.append(CF.prediction_sets(p[300:], qd, method, nonempty=False).sum(1).mean())
    assert 0.88 <= np.mean(cov) <= 0.9 + 1 / 301 + 0.01
    assert np.mean(size_r) < np.mean(size_d)
    with pytest.raises(InputError, match="Generator"):
        CF.calibrate(p, y, 0.1, method, rng=3)


def test_lac_sets_are_smallest_and_nested_in_alpha():
    rng = np.random.default_rng(1)
    p, y = _data(rng, 4000)
    size = {}
    for m in CF.METHODS:
        q = CF.calibrate(p[:2000], y[:2000], 0.1, m)
        size[m] = CF.prediction_sets(p[2000:], q, m).sum(1).mean()
    assert size["lac"] <= size["aps"] and size["lac"] <= size["raps"]
    s05 = CF.prediction_sets(p, CF.calibrate(p[:2000], y[:2000], 0.05), "lac")
    s20 = CF.prediction_sets(p, CF.calibrate(p[:2000], y[:2000], 0.2), "lac")
    assert np.all(s05 | ~s20)  # a smaller alpha never drops a class


def test_quantile_is_the_finite_sample_order_statistic():
    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
    y = np.array([0, 0, 0, 0])  # LAC scores 0.1, 0.4, 0.7, 0.8
    assert CF.calibrate(p, y, 0.4) == pytest.approx(0.7)  # ceil(5 * 0.6) = 3rd smallest
    assert CF.calibrate(p, y, 0.1) == float("inf")  # ceil(5 * 0.9) = 5 > 4: every class
    assert CF.prediction_sets(p, float("inf")).all()


def test_bad_input_is_a_typed_error():
    p = np.array([[0.5, 0.5]])
    with pytest.raises(InputError, match="alpha"):
        CF.calibrate(p, [0], 1.5)
    with pytest.raises(InputError, match="method"):
        CF.calibrate(p, [0], 0.1, "topk")
    with pytest.raises(InputError, match="labels"):
        CF.calibrate(p, [2], 0.1)
    with pytest.raises(InputError, match="summing to 1"):
        CF.prediction_sets(np.array([[0.5, 0.7]]), 0.3)


# ---- issue 51: the non-empty rule ----------------------------------------------------------

def test_a_confident_right_answer_lac_leaves_out_is_put_back():
    """The finding: LAC's set is empty for a 0.997-confident answer when the quantile asks for
    more; the rule makes it the answer alone, and leaves a set that had classes as it was."""
    p = np.array([[0.997, 0.002, 0.001], [0.6, 0.39, 0.01]])
    q = 0.002  # 1 - q = 0.998: no class of row 0 reaches it
    plain = CF.prediction_sets(p, q, nonempty=False)
    assert plain.sum(1).tolist() == [0, 0]
    assert CF.prediction_sets(p, q).tolist() == [[True, False, False], [True, False, False]]
    assert CF.prediction_sets(p, 0.65).tolist() == [[True, False, False], [True, True, False]]
    with pytest.raises(InputError, match="nonempty"):
        CF.prediction_sets(p, q, nonempty="yes")


def _confident(rng, n, C=8):
    """Probabilities about as sure as a trained classifier's (~95 % accurate), labels drawn
    from them (calibrated by construction): where LAC's plain sets are often empty."""
    p = np.exp(rng.normal(0, 2, (n, C)))
    p = (p / p.sum(1, keepdims=True)) ** 10
    p /= p.sum(1, keepdims=True)
    y = np.minimum((rng.random(n)[:, None] > p.cumsum(1)).sum(1), C - 1)
    return p, y


@pytest.mark.parametrize("method", CF.METHODS)
@pytest.mark.parametrize("randomised", [False, True])
def test_the_rule_adds_the_top_class_to_empty_sets_and_changes_nothing_else(method, randomised):
    rng = np.random.default_rng(7)
    p, y = _confident(rng, 3000)
    p[:50] = np.round(p[:50], 1) + 0.01  # ties between classes (renormalised: still ties)
    p[:50] /= p[:50].sum(1, keepdims=True)
    top = p.argmax(1)
    exercised = 0
    for alpha in (0.05, 0.1, 0.2, 0.4):
        q = CF.calibrate(p[:1000], y[:1000], alpha, method,
                         rng=np.random.default_rng(1) if randomised else None)
        plain = CF.prediction_sets(p, q, method, rng=np.random.default_rng(2) if randomised
                                   else None, nonempty=False)
        rule = CF.prediction_sets(p, q, method, rng=np.random.default_rng(2) if randomised
                                  else None)
        empty = plain.sum(1) == 0
        assert rule[np.arange(len(p)), top].all()  # the answer is in every set
        assert np.array_equal(rule[~empty], plain[~empty])  # a set with classes is unchanged
        assert np.array_equal(rule.sum(1), plain.sum(1) + empty)  # an empty one: the top alone
        exercised += int(empty.sum())
    assert exercised > 100  # many plain sets were empty: the rule was exercised


def _binom_lower(n: int, p: float, q: float = 0.01) -> int:
    """The q-quantile of Binomial(n, p): the smallest k with P(X <= k) >= q (exact, in logs)."""
    cdf = 0.0
    for k in range(n + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * math.log(p) + (n - k) * math.log1p(-p))
        if cdf >= q:
            return k
    return n


@pytest.mark.parametrize("method", CF.METHODS)
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_coverage_with_the_rule_stays_above_the_binomial_lower_bound(method, alpha):
    """Exchangeable draws: each of ``reps`` trials calibrates on fresh data and asks one fresh
    test point, so the hits are independent with probability >= 1 - alpha (the conformal
    guarantee, marginal over calibration and test) and their count is >= Binomial(reps, 1 -
    alpha) stochastically. With the rule the count must still clear that binomial's 1 %
    quantile (a correct implementation fails this with probability < 1 %; the seed is fixed)."""
    rng = np.random.default_rng(11)
    n_cal, reps = 100, 1500
    hits = plain_hits = empties = 0
    for _ in range(reps):
        p, y = _confident(rng, n_cal + 1)
        q = CF.calibrate(p[:n_cal], y[:n_cal], alpha, method)
        rule = CF.prediction_sets(p[n_cal:], q, method)[0]
        plain = CF.prediction_sets(p[n_cal:], q, method, nonempty=False)[0]
        hits += bool(rule[y[n_cal]])
        plain_hits += bool(plain[y[n_cal]])
        empties += not plain.any()
    assert hits >= _binom_lower(reps, 1 - alpha)
    assert hits >= plain_hits  # the rule only ever adds the true class
    if alpha >= 0.1:
        assert empties > 0  # some plain sets were empty: the rule was exercised


def test_numpy_scalars_are_numbers_and_bools_are_not():
    rng = np.random.default_rng(3)
    p, y = _data(rng, 99)
    # 99 samples at alpha 0.01: ceil(100 * 0.99) = 99, the largest score; np.float32(0.01) is
    # 0.0099999998 as a double, which would ask for the 100th (inf) were it not read as 0.01
    assert CF.calibrate(p, y, np.float32(0.01)) == CF.calibrate(p, y, 0.01) < float("inf")
    for a in (np.float32(0.1), np.float64(0.1), np.float16(0.1)):
        assert CF.calibrate(p, y, a) == CF.calibrate(p, y, 0.1)
    assert real_value(np.float32(0.3)) == 0.3 and real_value(np.int64(1)) == 1.0
    for bad in (True, np.bool_(False), "0.1", None):
        with pytest.raises(InputError, match="alpha must be"):
            CF.calibrate(p, y, bad)
    q = CF.calibrate(p, y, 0.2)
    assert np.array_equal(CF.prediction_sets(p, np.float32(q)), CF.prediction_sets(p, q)) or \
        np.float32(q) != q  # (a float32 quantile is a slightly other quantile: allowed)
    with pytest.raises(InputError, match="qhat"):
        CF.prediction_sets(p, True)
