"""The bank screen's pieces (exporters/ood_bank.py): spherical k-means prototypes per class
and per-row int8 codes, decoded as the device decodes them."""
from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.answers.uncertainty import decode_bank
from edge_sdk.errors import ConfigError
from exporters.ood_bank import class_prototypes, row_codes


def _unit(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _clusters(seed=0, classes=3, per_class=4, n=60, dim=16, spread=0.05):
    """Unit rows in tight clusters around random directions: [N, D], labels, directions
    [classes, per_class, D]."""
    rng = np.random.default_rng(seed)
    dirs = _unit(rng.normal(size=(classes * per_class, dim))).reshape(classes, per_class, dim)
    xs, ys = [], []
    for c in range(classes):
        for j in range(per_class):
            xs.append(_unit(dirs[c, j] + spread * rng.normal(size=(n, dim))))
            ys.append(np.full(n, c))
    order = rng.permutation(classes * per_class * n)  # rows not grouped by cluster
    return np.concatenate(xs)[order], np.concatenate(ys)[order], dirs


def test_prototypes_recover_well_separated_cluster_directions():
    x, y, dirs = _clusters()
    p = class_prototypes(x, y, 4)
    assert p.shape == (12, 16) and p.dtype == np.float32
    for c in range(3):
        got = p[4 * c:4 * c + 4]
        cos = got @ dirs[c].T  # every true direction has one prototype within a few degrees
        assert np.sort(cos.max(0)).min() > 0.99
        assert sorted(cos.argmax(1).tolist()) == [0, 1, 2, 3]  # one prototype per cluster


def test_prototypes_are_unit_rows_in_label_order():
    x, y, _ = _clusters(seed=1)
    p = class_prototypes(x, y + 5, 3)  # labels need not start at 0
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-6)
    means = _unit(np.stack([x[y == c].mean(0) for c in range(3)]))
    # each class's prototypes sit closer to its own mean than to the others'
    assert ((p @ means.T).argmax(1) == np.repeat(np.arange(3), 3)).all()


def test_one_prototype_is_the_renormalised_class_mean():
    x, y, _ = _clusters(seed=2)
    p = class_prototypes(x, y, 1)
    want = _unit(np.stack([x[y == c].mean(0) for c in range(3)]))
    np.testing.assert_allclose(p, want, atol=1e-6)


def test_deterministic_for_a_seed_and_seed_matters():
    x, y, _ = _clusters(seed=3, per_class=6, spread=0.5)
    a = class_prototypes(x, y, 8, seed=7)
    np.testing.assert_array_equal(a, class_prototypes(x, y, 8, seed=7))
    assert not np.array_equal(a, class_prototypes(x, y, 8, seed=8))


def test_a_small_class_keeps_its_rows():
    x, y, _ = _clusters(seed=4, classes=2, per_class=1, n=10)
    keep = (y == 0) | (np.cumsum(y == 1) <= 3)  # class 1 keeps 3 rows only
    x, y = x[keep], y[keep]
    p = class_prototypes(x, y, 4)
    assert p.shape == (4 + 3, 16)
    np.testing.assert_allclose(p[4:], x[y == 1], atol=1e-6)


def test_duplicate_rows_still_give_unit_prototypes():
    """Fewer distinct rows than clusters: seeding and the empty-cluster repair cope."""
    rng = np.random.default_rng(5)
    base = _unit(rng.normal(size=(2, 8)))
    x = np.repeat(base, 10, axis=0)
    p = class_prototypes(x, np.zeros(20, int), 4)
    assert p.shape == (4, 8)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-6)
    assert np.allclose(np.abs(p @ base.T).max(1), 1.0, atol=1e-6)  # each is one of the rows


def test_empty_cluster_is_reseeded_not_left_dead():
    # one tight cluster of 50 and 1 outlier, 3 clusters: no prototype may be a zero row
    rng = np.random.default_rng(6)
    x = _unit(np.concatenate([np.eye(8)[0] + 0.01 * rng.normal(size=(50, 8)),
                              np.eye(8)[1][None]]))
    p = class_prototypes(x, np.zeros(51, int), 3)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-6)
    assert (p @ np.eye(8)[1]).max() > 0.999  # the outlier is its own prototype


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_codes_use_the_row_grid_and_decode_close_to_the_row(bits):
    rng = np.random.default_rng(bits)
    u = _unit(rng.normal(size=(200, 32)))
    codes = row_codes(u, bits)
    q = 2 ** (bits - 1) - 1
    assert codes.dtype == np.int8 and codes.shape == u.shape
    assert np.abs(codes).max() == q and (np.abs(codes).max(1) == q).all()  # each row's peak
    dec = decode_bank(codes)
    # each scaled component moves by <= 1/2 of a step: ||u/|u| - c/|c||| <= 2 * 0.5 sqrt(D) / q'
    # with q' = q / max|u| the scaled row's norm
    bound = np.sqrt(32) * np.abs(u).max(1) / q
    assert (np.linalg.norm(dec - u, axis=1) <= bound + 1e-6).all()
    if bits == 8:
        assert (np.einsum("nd,nd->n", dec, u) > 0.999).all()


def test_codes_keep_a_zero_row_zero_and_match_the_formula():
    u = np.array([[0.0, 0.0, 0.0], [0.6, -0.8, 0.0], [0.1, 0.2, -0.3]])
    codes = row_codes(u, 8)
    assert codes[0].tolist() == [0, 0, 0]
    assert codes[1].tolist() == [95, -127, 0]  # round(0.6 / 0.8 * 127) = round(95.25)
    assert codes[2].tolist() == [42, 85, -127]
    assert row_codes(u, 4)[1].tolist() == [5, -7, 0]


@pytest.mark.parametrize("call, name", [
    (lambda x, y: class_prototypes(x, y, 0), "per_class"),
    (lambda x, y: class_prototypes(x, y, True), "per_class"),
    (lambda x, y: class_prototypes(x, y, 2, iters=0), "iters"),
    (lambda x, y: class_prototypes(x, y, 2, seed=-1), "seed"),
    (lambda x, y: class_prototypes(x, y[:-1], 2), "labels"),
    (lambda x, y: class_prototypes(x, y.astype(float), 2), "labels"),
    (lambda x, y: class_prototypes(2 * x, y, 2), "unit"),
    (lambda x, y: class_prototypes(x[0], y, 2), "unit"),
    (lambda x, y: class_prototypes(np.full_like(x, np.nan), y, 2), "unit"),
    (lambda x, y: row_codes(x, 1), "bits"),
    (lambda x, y: row_codes(x, 9), "bits"),
    (lambda x, y: row_codes(x, 4.0), "bits"),
    (lambda x, y: row_codes(x[:0], 8), "unit"),
    (lambda x, y: row_codes("rows", 8), "unit"),
])
def test_errors_name_the_bad_argument(call, name):
    x, y, _ = _clusters(seed=8, classes=2, per_class=1, n=5)
    with pytest.raises(ConfigError, match=name):
        call(x, y)
