"""The OOD score and conformal sets a bundle ships (issue 33): edge_sdk.answers.uncertainty and the
runtime fields built on it. Torch-free, on the session's digits bundle (layout files, every
scope, uncertainty.bin)."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

import edge_sdk
from edge_sdk.answers import conformal, ood
from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.errors import BundleError, ChecksumMismatchError, ConfigError
from edge_sdk.policy.plan import Stage
from edge_sdk.answers.uncertainty import ALPHAS, FILE_NAME, Uncertainty, cascade_key, check_alpha
from runtime_support import without_cascade_targets, without_val_accuracy


def _inputs(m, n, seed=0):
    lo, hi = m.manifest.input.value_range
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, (n, *m.manifest.input.shape[1:])).astype(np.float32)


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, profile=None)


def test_the_bundle_lists_a_verified_uncertainty_file(bundle, model):
    m = read_manifest(bundle)
    assert m.schema_version >= 5 and m.uncertainty is not None
    assert m.uncertainty.name == FILE_NAME
    assert (bundle / FILE_NAME).stat().st_size == m.uncertainty.bytes
    unc = model.uncertainty
    assert set(unc.quantiles) >= set(m.ids)  # every configuration has its quantiles
    widths = {f"{c.width:.2f}" for c in m.configurations}
    assert set(unc.widths) == widths


def test_point_and_head_answers_carry_a_score_all_scope_only_a_set(model):
    x = _inputs(model, 1)[0]
    for c in model.manifest.configurations:
        p = model.predict(x, config_id=c.id)
        assert p.prediction_set is not None
        assert list(p.prediction_set) == sorted(set(p.prediction_set))
        assert all(0 <= k < len(model.manifest.labels) for k in p.prediction_set)
        if c.scope == "all":
            assert p.ood_score is None and p.in_distribution is None
        else:
            thr = model.uncertainty.widths[f"{c.width:.2f}"].threshold
            assert isinstance(p.ood_score, float) and np.isfinite(p.ood_score)
            assert p.in_distribution == (p.ood_score <= thr)


def _features(model, cid, x):
    """The slice's features output for one normalised sample, straight from the interpreter."""
    (it, inp, *_), = model._interpreters(model.manifest.configuration(cid))
    it.set_tensor(inp, model._feed(x))
    it.invoke()
    return it.get_tensor(it.get_output_details()[1]["index"]).copy()


def test_the_score_is_the_reference_knn_score(model):
    """Cross-check: the device's fast path == edge_sdk.answers.ood.knn_score (float64) on the same
    decoded bank and k."""
    xs = _inputs(model, 6, seed=1)
    for c in model.manifest.configurations:
        if c.scope != "point":
            continue
        wk = f"{c.width:.2f}"
        feats = np.concatenate([_features(model, c.id, x) for x in xs])
        bank = model.uncertainty.widths[wk].bank.astype(np.float64)
        ref = ood.knn_score(feats, bank, k=model.uncertainty.k)
        fast = [model.uncertainty.score_one(wk, f) for f in feats]
        batch = model.uncertainty.score(wk, feats)
        assert np.allclose(fast, ref, atol=1e-5) and np.allclose(batch, ref, atol=1e-5)
        got = [model.predict(x, config_id=c.id).ood_score for x in xs]
        assert np.allclose(got, ref, atol=1e-5)


def test_the_set_is_lac_at_the_calibrated_quantile_and_grows_as_alpha_shrinks(model):
    xs = _inputs(model, 5, seed=2)
    cid = model.manifest.ids[0]
    for x in xs:
        p = model.predict(x, config_id=cid)
        q = model.uncertainty.qhat(cid, "lac", 0.1)
        want = np.flatnonzero(conformal.prediction_sets(np.asarray([p.probs]), q)[0]).tolist()
        assert list(p.prediction_set) == want
        sets = [set(model.predict(x, config_id=cid, alpha=a).prediction_set)
                for a in (0.05, 0.1, 0.2, 0.5)]
        assert all(a >= b for a, b in zip(sets, sets[1:]))


def test_an_alpha_between_grid_points_uses_the_grid_alpha_below_it(model):
    cid = model.manifest.ids[0]
    unc = model.uncertainty
    assert unc.qhat(cid, "lac", 0.12) == unc.qhat(cid, "lac", 0.1)
    assert unc.qhat(cid, "aps", 0.5) == unc.quantiles[cid]["aps"][ALPHAS.index(0.5)]


def test_out_of_distribution_answers_abstain_unless_switched_off(bundle):
    strict = edge_sdk.load(bundle, profile=None)
    lenient = edge_sdk.load(bundle, profile=None, abstain_on_ood=False)
    for m in (strict, lenient):
        for st in m.uncertainty.widths.values():
            st.threshold = -10.0  # scores are >= -1: nothing is in distribution
    x = _inputs(strict, 1)[0]
    cid = next(c.id for c in strict.manifest.configurations if c.scope == "point")
    p = strict.predict(x, config_id=cid)
    q = lenient.predict(x, config_id=cid)
    assert p.in_distribution is False and p.abstain
    thr = lenient.manifest.configuration(cid).thresholds[lenient._target_key]
    assert q.abstain == (thr is None or q.confidence < thr)


def test_predict_batch_returns_arrays_equal_to_the_predictions(model):
    xs = _inputs(model, 7, seed=3)
    cid = next(c.id for c in model.manifest.configurations if c.scope == "point")
    b = model.predict_batch(xs, config_id=cid)
    assert isinstance(b, edge_sdk.runtime.model.BatchPrediction) and len(b) == 7
    assert b.probs.shape == (7, len(model.manifest.labels))
    assert b.labels.tolist() == [p.label for p in b]
    assert np.allclose(b.confidence, [p.confidence for p in b])
    assert b.abstain.tolist() == [p.abstain for p in b]
    assert np.allclose(b.ood_score, [p.ood_score for p in b])
    assert b.in_distribution.tolist() == [p.in_distribution for p in b]
    assert [tuple(np.flatnonzero(r)) for r in b.prediction_sets] == [p.prediction_set for p in b]
    with pytest.raises(ValueError):
        b.probs[0, 0] = 1.0  # read-only
    assert b == list(b) and b[1:3] == list(b)[1:3]
    singles = [model.predict(x, config_id=cid) for x in xs]  # batched invoke == single
    assert np.allclose(b.ood_score, [p.ood_score for p in singles], atol=1e-5)


def test_the_cascade_answers_with_its_plans_quantile(model):
    cfgs = [c for c in model.manifest.configurations if c.scope == "point"]
    a, b = cfgs[0], cfgs[-1]
    stages = (Stage(a, 0.9, 1.0), Stage(b, None, 2.0))
    key = cascade_key(a.id, b.id)
    if key in model.uncertainty.quantiles:
        assert model._set_key(stages, b, cut=False) == key
        assert model._set_key(stages, a, cut=False) == key
    assert model._set_key(stages, a, cut=True) == a.id  # cut short by the budget
    assert model._set_key((Stage(a, None, 1.0),), a, cut=False) == a.id


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0.0}, "alpha must be"), ({"alpha": 1.5}, "alpha must be"),
    ({"alpha": True}, "alpha must be"), ({"conformal": "thr"}, "conformal must be one of"),
    ({"uncertainty": "yes"}, "uncertainty must be True or False"),
    ({"abstain_on_ood": 1}, "abstain_on_ood must be True or False")])
def test_bad_options_are_typed_errors(bundle, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        edge_sdk.load(bundle, profile=None, **kwargs)


def test_a_bad_per_call_alpha_is_refused(model):
    with pytest.raises(ConfigError, match="alpha must be"):
        model.predict(_inputs(model, 1)[0], alpha=-0.1)
    with pytest.raises(ConfigError, match="alpha must be"):
        check_alpha("0.1")


def test_uncertainty_false_answers_without_the_fields(bundle):
    m = edge_sdk.load(bundle, profile=None, uncertainty=False)
    p = m.predict(_inputs(m, 1)[0])
    assert (p.ood_score, p.in_distribution, p.prediction_set) == (None, None, None)
    assert m.uncertainty is None


def test_a_modified_uncertainty_file_is_refused_at_load(bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    blob = bytearray((dst / FILE_NAME).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (dst / FILE_NAME).write_bytes(bytes(blob))
    with pytest.raises(ChecksumMismatchError, match=FILE_NAME):
        edge_sdk.load(dst, profile=None)


def test_an_older_bundle_loads_with_no_score_and_no_set(bundle, tmp_path):
    dst = tmp_path / "v4"
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    data["schema_version"] = 4
    without_cascade_targets(data)  # schema version 8's
    without_val_accuracy(data)  # schema version 10's
    del data["uncertainty"]
    data.pop("input_stats", None)
    (dst / FILE_NAME).unlink()
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    m = edge_sdk.load(dst, profile=None)
    b = m.predict_batch(_inputs(m, 3))
    assert all(p.ood_score is None and p.prediction_set is None for p in b)
    assert b.ood_score is None and b.prediction_sets is None


def test_a_version_4_manifest_cannot_list_an_uncertainty_file(bundle):
    data = read_manifest(bundle).to_dict()
    data["schema_version"] = 4
    with pytest.raises(BundleError, match="uncertainty: needs schema version 5"):
        Manifest.from_dict(data)


def test_a_foreign_uncertainty_file_is_refused(model):
    from edge_sdk.store import Store, encode_store

    idx = dict(model.uncertainty.index, version=99)
    with pytest.raises(BundleError, match="index version 99"):
        Uncertainty.from_bytes(encode_store(Store(idx, {})))
    idx = dict(model.uncertainty.index)
    wk = next(iter(idx["widths"]))
    arrays = {f"{w}/bank": np.zeros((2, 3), np.int8) for w in idx["widths"]}
    with pytest.raises(BundleError, match=f"widths.{wk}: bank must be int8"):
        Uncertainty.from_bytes(encode_store(Store(idx, arrays)))


def _mutated(model, **change):
    from edge_sdk.store import Store, decode_store, encode_store

    blob = (model.bundle_dir / FILE_NAME).read_bytes()
    store = decode_store(blob)
    idx = json_copy(store.index)
    for path, value in change.items():
        node = idx
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return encode_store(Store(idx, {k: np.array(v) for k, v in store.arrays.items()}))


def json_copy(obj):
    import json

    return json.loads(json.dumps(obj))


@pytest.mark.parametrize("change, match", [
    ({"k": 0}, "k must be an integer >= 1"), ({"k": True}, "k must be an integer >= 1"),
    ({"k": 2}, "1 from version 2"), ({"accept": 1.5}, "accept must be in"),
    ({"score": "energy"}, "score 'energy'"), ({"alphas": [0.1]}, "alphas"),
    ({"raps": {}}, "raps must hold"), ({"widths": {}}, "at least one width"),
    ({"quantile_keys": {}}, "quantile_keys must be a list"),
    ({"score": "knn", "version": 3}, "index version 3")])
def test_a_malformed_index_is_a_bundle_error_naming_it(model, change, match):
    with pytest.raises(BundleError, match=match):
        Uncertainty.from_bytes(_mutated(model, **change))


def test_non_finite_or_short_quantiles_are_refused(model):
    from edge_sdk.store import Store, decode_store, encode_store

    store = decode_store((model.bundle_dir / FILE_NAME).read_bytes())
    q = np.array(store.arrays["quantiles"])
    for bad, match in ((np.full_like(q, np.nan), "without NaN"), (q[:, :, :5], "quantiles must be"),
                       (q.astype(np.float32), "quantiles must be float16")):
        arrays = {**{k: np.array(v) for k, v in store.arrays.items()}, "quantiles": bad}
        with pytest.raises(BundleError, match=match):
            Uncertainty.from_bytes(encode_store(Store(store.index, arrays)))
    wk = next(iter(model.uncertainty.widths))
    with pytest.raises(BundleError, match="expected a finite number"):
        Uncertainty.from_bytes(_mutated(model, **{f"widths__{wk}__threshold": "nan"}))


def test_quantiles_are_stored_rounded_up():
    """float16 storage never lowers a quantile (a set can only grow), and raises it by at most
    one float16 step."""
    from edge_sdk.answers.uncertainty import quantile_array

    rng = np.random.default_rng(0)
    table = {f"c{i}": {m: [None if rng.random() < 0.1 else float(v) for v in rng.random(10)]
                       for m in ("lac", "aps", "raps")} for i in range(5)}
    keys, q = quantile_array(table)
    assert keys == list(table) and q.dtype == np.float16
    for i, k in enumerate(keys):
        for j, m in enumerate(("lac", "aps", "raps")):
            for a, v in enumerate(table[k][m]):
                want = math.inf if v is None else v
                assert float(q[i, j, a]) >= want
                assert v is None or float(q[i, j, a]) - want <= 2 ** -10 * max(want, 2 ** -14)


# ---- issue 51: every set holds the answer; alpha is a grid number --------------------------

def _emptied(bundle, method):
    """A model whose every quantile (configurations and cascade plans) leaves the plain set
    empty: q = -1 is below every score, as LAC's quantile is for a 0.997-confident answer."""
    m = edge_sdk.load(bundle, profile=None, conformal=method)
    for key in m.uncertainty.quantiles:
        m.uncertainty.quantiles[key] = {k: (-1.0,) * len(ALPHAS) for k in conformal.METHODS}
    m._qhats.clear()  # (load's cost probe looked some up already)
    return m


@pytest.mark.parametrize("method", conformal.METHODS)
def test_every_set_holds_the_answer_where_the_plain_set_is_empty(bundle, model, method):
    m = _emptied(bundle, method)
    xs = _inputs(m, 6, seed=5)
    eye = np.eye(len(m.manifest.labels), dtype=bool)
    for c in m.manifest.configurations:  # every scope: point, head, all
        b = m.predict_batch(xs, config_id=c.id)
        singles = [m.predict(x, config_id=c.id) for x in xs]
        assert all(p.prediction_set == (p.label,) for p in (*b, *singles))
        assert np.array_equal(b.prediction_sets, eye[b.labels])
        # abstain is decided as before (the bundle's own quantiles): the rule never touches it
        ref = model.predict_batch(xs, config_id=c.id)
        assert b.abstain.tolist() == ref.abstain.tolist() == [p.abstain for p in singles]
    pts = [c for c in m.manifest.configurations if c.scope == "point"]
    for accept, answers in ((0.0, pts[0].id), (1.01, pts[-1].id)):  # either stage answers
        stages = (Stage(pts[0], accept, 1.0), Stage(pts[-1], None, 2.0))
        one = m._execute_one(m._inputs.feed(xs[0]), stages, m._budget, m._clock())
        batch = m._execute_batch(m._inputs.feed_batch(xs), stages, m._budget, m._clock())
        for p in (one, *batch):
            assert p.config_id == answers and p.prediction_set == (p.label,)


@pytest.mark.parametrize("method", conformal.METHODS)
def test_with_the_bundles_quantiles_a_set_is_the_plain_set_plus_the_answer(bundle, method):
    m = edge_sdk.load(bundle, profile=None, conformal=method)
    lam, k_reg = m.uncertainty.raps
    xs = _inputs(m, 8, seed=7)
    cid = next(c.id for c in m.manifest.configurations if c.scope == "point")
    for a in (0.05, 0.1, 0.5):
        b = m.predict_batch(xs, config_id=cid, alpha=a)
        plain = conformal.prediction_sets(b.probs, m.uncertainty.qhat(cid, method, a), method,
                                          lam, k_reg, nonempty=False)
        plain[np.arange(len(xs)), b.labels] = True
        assert np.array_equal(b.prediction_sets, plain)
        assert [m.predict(x, config_id=cid, alpha=a).prediction_set for x in xs] == \
            [tuple(np.flatnonzero(r)) for r in plain]


@pytest.mark.parametrize("alpha", [0.6, 0.99, 0.005])
def test_an_alpha_outside_the_grid_is_refused_never_capped(bundle, model, alpha):
    match = r"alpha must be a miscoverage rate in \[0.01, 0.5\], the range of the bundle's"
    xs = _inputs(model, 2)
    with pytest.raises(ConfigError, match=match):
        edge_sdk.load(bundle, profile=None, alpha=alpha)
    with pytest.raises(ConfigError, match=match):
        model.predict(xs[0], alpha=alpha)
    with pytest.raises(ConfigError, match=match):
        model.predict_batch(xs, alpha=alpha)
    with pytest.raises(ConfigError, match=match):
        model.uncertainty.qhat(model.manifest.ids[0], "lac", alpha)
    assert check_alpha(0.5) == 0.5 and check_alpha(0.01) == 0.01  # the grid's ends are in it


def test_numpy_scalar_alphas_are_numbers_and_bools_are_not(bundle, model):
    m = edge_sdk.load(bundle, profile=None, alpha=np.float32(0.2))
    assert m.alpha == 0.2 and type(m.alpha) is float
    xs = _inputs(model, 4, seed=6)
    cid = model.manifest.ids[0]
    assert m.predict(xs[0], config_id=cid).prediction_set == \
        model.predict(xs[0], config_id=cid, alpha=0.2).prediction_set
    # np.float32(0.01) is 0.0099999998 as a double: still the grid's 0.01, not refused
    for a, same in ((np.float32(0.01), 0.01), (np.float64(0.1), 0.1), (np.float32(0.15), 0.15),
                    (np.float16(0.5), 0.5)):
        want = model.predict_batch(xs, config_id=cid, alpha=same)
        assert np.array_equal(model.predict_batch(xs, config_id=cid, alpha=a).prediction_sets,
                              want.prediction_sets)
        assert model.predict(xs[0], config_id=cid, alpha=a).prediction_set == \
            want[0].prediction_set
    for bad in (True, np.bool_(True), "0.1"):
        with pytest.raises(ConfigError, match="alpha must be"):
            edge_sdk.load(bundle, profile=None, alpha=bad)
        with pytest.raises(ConfigError, match="alpha must be"):
            model.predict(xs[0], alpha=bad)
        with pytest.raises(ConfigError, match="alpha must be"):
            model.predict_batch(xs, alpha=bad)
