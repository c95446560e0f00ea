"""Fitting uncertainty.bin (issue 33): the features output is the torch network's classifier
input, the KNN score agrees with scikit-learn, banks are stratified, and the conformal
quantiles (per configuration and per cascade plan) cover as split-conformal promises."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from edge_sdk.answers.uncertainty import ALPHAS, BANK_SCALE, Uncertainty, WidthStats, decode_bank
from exporters.tflite import export_point_slice
from exporters.uncertainty import _quantiles, bank_rows, run_outputs
from tests.support import randomise
from trainer.models import create_model


@pytest.fixture(scope="module")
def sliced():
    torch.manual_seed(0)
    model = create_model("nested_cnn_small").double().eval()
    randomise(model, 0)
    return model.truncate(0.5).eval()


def test_the_features_output_is_the_classifiers_input(sliced):
    """TFLite's second output == the torch slice's input to its final linear layer."""
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    seen = {}
    last = [m for m in sliced.modules() if isinstance(m, torch.nn.Module)
            and type(m).__name__ == "BayesNestedLinear"][-1]
    h = last.register_forward_hook(lambda m, i, o: seen.update(f=i[0].detach()))  # -> None
    with torch.no_grad():
        logits = sliced(x)
    h.remove()
    buf, info = export_point_slice(sliced, [1, 8, 8, 1], "float", features=True)
    assert info["features"]["shape"] == [1, seen["f"].shape[1]]
    got_logits, got_f = run_outputs(buf, x.permute(0, 2, 3, 1).numpy())
    ref = seen["f"].numpy()
    assert np.abs(got_f - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(got_logits - logits.numpy()).max() <= 1e-5 * logits.abs().max().item()


def test_without_features_the_slice_has_one_output(sliced):
    buf, info = export_point_slice(sliced, [1, 8, 8, 1], "float")
    assert "features" not in info and len(run_outputs(buf, np.zeros((2, 8, 8, 1)))) == 1


def test_the_knn_score_agrees_with_scikit_learn():
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(300, 12)), rng.normal(size=(40, 12))
    unit = train / np.linalg.norm(train, axis=1, keepdims=True)
    bank = np.round(unit * BANK_SCALE).astype(np.int8)
    dec = decode_bank(bank)
    raps = {"lam": 0.01, "k_reg": 5}
    # index version 1 (k-th of the bank, numpy) and version 2 (k = 1, the graph's maths)
    for version, k in ((1, 7), (2, 1)):
        unc = Uncertainty({"version": version, "k": k, "accept": 0.95, "raps": raps},
                          {"1.00": WidthStats(dec, 0.0, 12)}, {})
        nn = NearestNeighbors(n_neighbors=k, metric="cosine").fit(dec.astype(np.float64))
        dist, _ = nn.kneighbors(test)
        # cosine distance = 1 - cos, so minus the k-th similarity is distance - 1
        assert np.allclose(unc.score("1.00", test), dist[:, -1] - 1.0, atol=1e-5)
        assert np.allclose([unc.score_one("1.00", t.astype(np.float32)) for t in test],
                           dist[:, -1] - 1.0, atol=1e-5)


def test_the_bank_is_a_class_stratified_draw():
    labels = np.repeat(np.arange(4), [400, 300, 200, 100])
    pick = bank_rows(labels, 100, seed=3)
    assert len(pick) == len(set(pick)) == 100
    assert np.bincount(labels[pick]).tolist() == [40, 30, 20, 10]
    assert bank_rows(labels, 2000, 0).tolist() == list(range(1000))
    assert not np.array_equal(pick, bank_rows(labels, 100, seed=4))


def _synthetic(rng, n, classes=5, sharp=2.0):
    logits = rng.normal(size=(n, classes)) * sharp
    y = np.array([rng.choice(classes, p=np.exp(r) / np.exp(r).sum()) for r in logits])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return p, y


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_cascade_quantiles_cover_the_mixture(method):
    """Split-conformal on the cascade's composite answer: over repeated calibration / test
    draws, the mean coverage is in [1 - alpha, 1 - alpha + 1/(n+1)] (up to Monte Carlo
    noise), for each grid alpha the issue reports."""
    from edge_sdk.answers.conformal import class_scores

    rng = np.random.default_rng(1)
    n, reps = 300, 150
    cov = {a: [] for a in (0.05, 0.1, 0.2)}
    for _ in range(reps):
        p1, y = _synthetic(rng, 2 * n, sharp=1.0)
        p2 = 0.3 * p1 + 0.7 * np.eye(5)[y] * 0.6 + 0.7 * 0.4 / 5  # a better second stage
        mixed = np.where((p1.max(1) >= 0.5)[:, None], p1, p2)
        q = _quantiles(mixed[:n], y[:n])
        s = class_scores(mixed[n:], method, 0.01, 5)
        for a in cov:
            qa = q[method][ALPHAS.index(a)]
            qa = math.inf if qa is None else qa
            cov[a].append(float((s[np.arange(n), y[n:]] <= qa).mean()))
    for a, c in cov.items():
        se = np.std(c) / np.sqrt(reps)
        assert 1 - a - 4 * se <= np.mean(c) <= 1 - a + 1 / (n + 1) + 4 * se, (a, np.mean(c))


def test_quantiles_beyond_the_calibration_set_mean_every_class():
    p, y = _synthetic(np.random.default_rng(2), 20)
    q = _quantiles(p, y)
    assert q["lac"][ALPHAS.index(0.01)] is None  # ceil(21 * 0.99) = 21 > 20
    assert q["lac"][ALPHAS.index(0.5)] is not None
