"""Inputs unlike the training data (issue 34, goal 4): the manifest's ``input_stats`` (schema
version 6), :class:`edge_sdk.inputs.stats.SuspectCheck` and ``Prediction.input_suspect`` on the
session's digits bundle (trained on scikit-learn's digits, raw values 0..16)."""
from __future__ import annotations

import numpy as np
import pytest

import edge_sdk
from edge_sdk.bundle import InputStats, Manifest, read_manifest
from edge_sdk.errors import BundleError, InputError
from edge_sdk.inputs.stats import SuspectCheck
from runtime_support import without_cascade_targets, without_val_accuracy


def _stats(channels=1, mean=(2.0, 6.0), top=(14.0, 16.0), margin=1.0) -> InputStats:
    return InputStats(channels=channels, mean=(4.0,) * channels, q99=(16.0,) * channels,
                      q999=(16.0,) * channels, sample_mean=(mean,) * channels,
                      sample_max=(top,) * channels, margin=margin)


@pytest.fixture(scope="module")
def digits():
    # the bundle's own data set; the device-only venv (CI's tflite-runtime step) has no
    # scikit-learn, where the rule's tests below still run
    datasets = pytest.importorskip("sklearn.datasets", reason="needs scikit-learn's digits")
    return datasets.load_digits().images.astype(np.float32)[..., None]  # [1797, 8, 8, 1]


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, profile=None)


# ---- the rule -------------------------------------------------------------------------------
@pytest.mark.parametrize("channels", [1, 3])
def test_a_sample_is_suspect_exactly_when_a_statistic_leaves_its_widened_band(channels):
    check = SuspectCheck(_stats(channels))
    x = np.full((4, 4, channels), 4.0, np.float32)
    x[0, 0] = 15.0  # mean 4.6875, max 15: inside both bands
    assert not check.one(x)
    # the bands are [2 - 1, 6 + 1] for the mean and [14 - 1, 16 + 1] for the maximum
    for value, suspect in ((13.0, False), (12.9, True)):  # the maximum at the band's edge
        y = x.copy()
        y[0, 0, channels - 1] = value
        assert check.one(y) is suspect, value
    dark = x / 16  # the same image scaled to [0, 1]: mean and maximum far below
    assert check.one(dark)
    bright = np.full_like(x, 7.5)  # mean above 6 + 1, maximum inside its band
    assert check.one(bright)
    batch = np.stack([x, dark, bright, x])
    assert check.batch(batch).tolist() == [check.one(s) for s in batch]


def test_a_grey_image_without_its_channel_axis_is_checked_alike():
    check = SuspectCheck(_stats(1))
    x = np.full((4, 4), 4.0, np.float32)
    x[0, 0] = 15.0
    assert check.one(x) == check.one(x[..., None]) is False
    assert check.batch(np.stack([x / 16, x])).tolist() == [True, False]


# ---- the manifest ---------------------------------------------------------------------------
def test_the_bundle_carries_the_training_splits_statistics(bundle):
    m = read_manifest(bundle)
    assert m.schema_version >= 6 and m.input_stats is not None
    s = m.input_stats
    assert s.channels == m.input.channels == 1
    lo, hi = m.input.value_range
    assert s.margin == pytest.approx(0.1 * (hi - lo))
    (mlo, mhi), (xlo, xhi) = s.sample_mean[0], s.sample_max[0]
    assert lo <= mlo <= mhi <= hi and lo <= xlo <= xhi <= hi
    assert s.mean[0] == pytest.approx(m.input.mean[0], rel=1e-5)  # the same training split
    assert s.q99[0] <= s.q999[0] <= hi


def test_input_stats_round_trip_and_bad_values_name_their_key(bundle):
    data = read_manifest(bundle).to_dict()
    assert Manifest.from_dict(data).input_stats == read_manifest(bundle).input_stats
    st = data["input_stats"]
    bad = dict(data, input_stats=dict(st, channels=3))
    with pytest.raises(BundleError, match=r"input_stats\.mean: expected a list of 3 items"):
        Manifest.from_dict(bad)
    three = {k: (v * 3 if isinstance(v, list) else v) for k, v in st.items()}
    bad = dict(data, input_stats=dict(three, channels=3))
    with pytest.raises(BundleError, match=r"input_stats\.channels: expected 1 \(the input's "
                                          r"channels\), got 3"):
        Manifest.from_dict(bad)
    bad = dict(data, input_stats=dict(data["input_stats"], sample_max=[[16.0, 15.0]]))
    with pytest.raises(BundleError, match=r"input_stats\.sample_max\[0\]: expected \[lo, hi\] "
                                          r"with lo <= hi"):
        Manifest.from_dict(bad)
    bad = dict(data, input_stats=dict(data["input_stats"], margin=-1.0))
    with pytest.raises(BundleError, match=r"input_stats\.margin: expected a margin >= 0"):
        Manifest.from_dict(bad)
    old = without_val_accuracy(without_cascade_targets(dict(data, schema_version=5)))
    with pytest.raises(BundleError, match="input_stats: needs schema version 6"):
        Manifest.from_dict(old)
    old.pop("input_stats")
    assert Manifest.from_dict(old).input_stats is None  # a version-5 manifest still reads


# ---- the runtime ----------------------------------------------------------------------------
def test_digits_scaled_to_0_1_are_flagged_and_abstain(model, digits):
    b = model.predict_batch(digits[:200] / 16)  # every value in range: no InputError
    assert b.input_suspect.all() and b.abstain.all()
    p = model.predict(digits[0] / 16)
    assert p.input_suspect is True and p.abstain is True
    assert p.to_dict()["input_suspect"] is True


def test_at_most_one_percent_of_real_digits_are_flagged(model, digits):
    b = model.predict_batch(digits)
    assert b.input_suspect.mean() <= 0.01
    for i in range(0, len(digits), 97):  # one sample at a time: the same flag
        assert model.predict(digits[i]).input_suspect == bool(b.input_suspect[i])


def test_out_of_range_values_stay_an_input_error(model, digits):
    with pytest.raises(InputError, match="raw range"):
        model.predict(digits[0] * 2)


def test_the_flag_can_be_switched_off_or_kept_out_of_abstain(bundle, digits):
    off = edge_sdk.load(bundle, profile=None, input_check=False)
    p = off.predict(digits[0] / 16)
    assert p.input_suspect is None
    assert off.predict_batch(digits[:3] / 16).input_suspect is None
    lenient = edge_sdk.load(bundle, profile=None, abstain_on_ood=False, uncertainty=False)
    cid = next(c.id for c in lenient.manifest.configurations if c.scope == "point")
    q = lenient.predict(digits[0] / 16, config_id=cid)
    thr = lenient.manifest.configuration(cid).thresholds[lenient._target_key]
    assert q.input_suspect is True
    assert q.abstain == (thr is None or q.confidence < thr)  # the confidence rule alone
    with pytest.raises(edge_sdk.ConfigError, match="input_check must be True or False"):
        edge_sdk.load(bundle, profile=None, input_check="yes")


def test_a_bundle_without_statistics_answers_none(bundle, tmp_path, digits):
    import shutil

    from edge_sdk.bundle import MANIFEST_NAME, manifest_to_yaml

    dst = tmp_path / "old"
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    data.pop("input_stats")
    data["schema_version"] = 5
    without_cascade_targets(data)  # schema version 8's
    without_val_accuracy(data)  # schema version 10's
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    m = edge_sdk.load(dst, profile=None)
    assert m.predict(digits[0] / 16).input_suspect is None
    assert m.predict_batch(digits[:2]).input_suspect is None
