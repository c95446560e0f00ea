"""Issue 33: every OOD score and metric of ``edge_sdk.answers.ood`` / ``edge_sdk.answers.metrics`` against an
independent reference implementation (scikit-learn, scipy, brute force) on the same features."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.covariance import LedoitWolf, ledoit_wolf as sk_ledoit_wolf
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from sklearn.neighbors import NearestNeighbors

from edge_sdk.answers import metrics as M
from edge_sdk.answers import ood as O
from edge_sdk.errors import InputError


@pytest.fixture
def feats():
    rng = np.random.default_rng(0)
    C, D = 4, 12
    centres = rng.normal(0, 3, (C, D))
    mix = rng.normal(size=(D, D)) / np.sqrt(D)
    y = rng.integers(0, C, 600)
    x = centres[y] + rng.normal(size=(600, D)) @ mix
    q = np.r_[centres[rng.integers(0, C, 50)] + rng.normal(size=(50, D)) @ mix,
              rng.normal(0, 6, (50, D))]
    return x, y, q, C


@pytest.mark.parametrize("n,d", [(300, 20), (30, 50)])
def test_ledoit_wolf_matches_sklearn(n, d):
    x = np.random.default_rng(n).normal(size=(n, d)) @ np.random.default_rng(d).normal(size=(d, d))
    cov, s = O.ledoit_wolf(x)
    ref_cov, ref_s = sk_ledoit_wolf(x)
    assert s == pytest.approx(ref_s, rel=1e-9)
    np.testing.assert_allclose(cov, ref_cov, rtol=1e-9, atol=1e-12)


def test_mahalanobis_matches_sklearn(feats):
    x, y, q, C = feats
    g = O.fit_gaussian(x, y, C)
    means = np.stack([x[y == c].mean(0) for c in range(C)])
    lw = LedoitWolf(assume_centered=True).fit(x - means[y])
    ref = np.stack([lw.mahalanobis(q - means[c]) for c in range(C)], 1)
    np.testing.assert_allclose(O.mahalanobis_score(q, g), ref.min(1), rtol=1e-7)
    glob = LedoitWolf().fit(x)
    ref_rel = (ref - glob.mahalanobis(q)[:, None]).min(1)
    np.testing.assert_allclose(O.relative_mahalanobis_score(q, g), ref_rel, rtol=1e-6, atol=1e-6)


def test_knn_matches_sklearn(feats):
    x, _, q, _ = feats
    bank = O.l2_normalise(x)
    for k in (1, 10):
        nn = NearestNeighbors(n_neighbors=k, metric="cosine").fit(bank)
        dist, _ = nn.kneighbors(O.l2_normalise(q))
        # cosine distance = 1 - cos; ours is -cos
        np.testing.assert_allclose(O.knn_score(q, bank, k), dist[:, -1] - 1.0, atol=1e-10)
    with pytest.raises(InputError, match="k must be"):
        O.knn_score(q, bank, len(bank) + 1)
    with pytest.raises(InputError, match="columns"):
        O.knn_score(q[:, :3], bank, 1)


def test_energy_matches_scipy():
    z = np.random.default_rng(1).normal(0, 5, (40, 7))
    np.testing.assert_allclose(O.energy_score(z), -logsumexp(z, 1), rtol=1e-12)
    np.testing.assert_allclose(O.energy_score(z, 2.0), -2.0 * logsumexp(z / 2.0, 1), rtol=1e-12)
    with pytest.raises(InputError, match="finite"):
        O.energy_score(np.full((2, 3), np.nan))


def test_fusion_uses_validation_statistics_only():
    rng = np.random.default_rng(2)
    a, b = rng.normal(5, 2, 300), rng.normal(-1, 0.5, 300)
    norms = [O.fit_zscore(a), O.fit_zscore(b)]
    fused = O.fused_score([a, b], norms)
    assert fused.mean() == pytest.approx(0.0, abs=1e-9)
    assert fused.std() == pytest.approx(np.sqrt(2 + 2 * np.corrcoef(a, b)[0, 1]), rel=1e-9)
    with pytest.raises(InputError, match="constant"):
        O.fit_zscore(np.ones(5))


def test_ood_metrics_match_sklearn():
    rng = np.random.default_rng(3)
    s_in, s_out = np.round(rng.normal(size=500), 1), np.round(rng.normal(0.8, size=300), 1)
    y = np.r_[np.zeros(500), np.ones(300)]
    s = np.r_[s_in, s_out]
    assert M.ood_aupr(s_in, s_out) == pytest.approx(average_precision_score(y, s), rel=1e-12)
    assert M.ood_auroc(s_in, s_out) == pytest.approx(roc_auc_score(y, s), rel=1e-12)
    fpr, tpr, _ = roc_curve(1 - y, -s)  # in-distribution positive, accepted when -s is high
    assert M.ood_fpr_at_tpr(s_in, s_out) == pytest.approx(fpr[np.searchsorted(tpr, 0.95)])
    with pytest.raises(InputError, match="tpr"):
        M.ood_fpr_at_tpr(s_in, s_out, 1.5)
