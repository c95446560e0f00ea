"""Issue 33: split-conformal sets keep their coverage promise on synthetic data."""
from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.answers import conformal as CF
from edge_sdk.errors import InputError


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
        sets = CF.prediction_sets(p[n_cal:], q, method)
        cov.append(sets[np.arange(n_test), y[n_cal:]].mean())
    mean = float(np.mean(cov))
    # E[coverage] is in [1 - a, 1 - a + 1/(n+1)]; the mean of 60 runs has sd ~ 0.0025
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
        sets = CF.prediction_sets(p[300:], q, method, rng=rng)
        cov.append(sets[np.arange(300), y[300:]].mean())
        size_r.append(sets.sum(1).mean())
        qd = CF.calibrate(p[:300], y[:300], 0.1, method)
        size_d.append(CF.prediction_sets(p[300:], qd, method).sum(1).mean())
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
