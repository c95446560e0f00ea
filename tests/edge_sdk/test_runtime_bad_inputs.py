"""Issue 19 §3: every bad input to load() / predict() / predict_batch() gets a typed error from
edge_sdk.errors naming what was wrong and what was expected; never a raw TypeError from deep
inside, never a silently wrong answer. Each case is a reproduction from the audit. Real bundle,
no torch."""
from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

import edge_sdk
from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.errors import (BudgetError, BudgetNotMetError, BundleError, ConfigError,
                             EdgeSdkError, InputError, ProfileError)
from edge_sdk.policy.budget import Budget

PLENTY_MB = 1e6


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)


@pytest.fixture(scope="module")
def x(model):
    lo, hi = model.input_spec.value_range
    return np.full(model.input_spec.shape[1:], (lo + hi) / 2, np.float32)


# --------------------------------------------------------------------------- per-call budgets
NOT_BUDGETS = [5, 0, 0.0, 2.5, {"latency_ms": 1}, "fast", [1.0], (1.0, None), True,
               np.float64(3.0)]


@pytest.mark.parametrize("bad", NOT_BUDGETS, ids=repr)
def test_a_per_call_budget_that_is_not_a_budget_is_a_budget_error(model, x, bad):
    with pytest.raises(BudgetError, match="must be an edge_sdk.Budget") as info:
        model.predict(x, bad)
    assert type(bad).__name__ in str(info.value)
    with pytest.raises(BudgetError, match="must be an edge_sdk.Budget"):
        model.predict_batch(np.stack([x, x]), bad)


def test_zero_is_not_silently_no_budget(model, x):
    """predict(x, 0) used to mean 'the model's budget' (0 is falsy)."""
    with pytest.raises(BudgetError, match=r"Budget\(latency_ms=0\)"):
        model.predict(x, 0)


def test_a_number_gets_a_hint_how_to_write_the_budget(model, x):
    with pytest.raises(BudgetError, match=r"edge_sdk.Budget\(latency_ms=5\)"):
        model.predict(x, 5)


# --------------------------------------------------------------------------- load() arguments
@pytest.mark.parametrize("cap", ["x", -5, 0, math.nan, True, np.bool_(True), [3]],
                         ids=repr)
def test_memory_cap_mb_must_be_a_positive_number(bundle, cap):
    # a load() argument: ConfigError (issue 51; it was a BudgetError)
    with pytest.raises(ConfigError, match="memory_cap_mb must be a positive number"):
        edge_sdk.load(bundle, memory_cap_mb=cap)


@pytest.mark.parametrize("cap", [math.inf, 10 ** 400, 1e300, 2.0 ** 20 + 1], ids=repr)
def test_memory_cap_mb_is_bounded(bundle, cap):
    """(issue 36) 10**400 raised a raw OverflowError; every value above 1 TiB is typed."""
    with pytest.raises(ConfigError, match=r"memory_cap_mb must be at most 1\.04858e\+06 MB"):
        edge_sdk.load(bundle, memory_cap_mb=cap)


def test_a_memory_cap_below_every_configuration_is_reported(bundle):
    m = edge_sdk.load(bundle)
    smallest = min(m.policy.memory_need_mb(c) for c in m.manifest.configurations)
    with pytest.raises(ConfigError, match="below every configuration's memory need") as info:
        edge_sdk.load(bundle, memory_cap_mb=smallest / 2)
    assert f"{smallest:.4g} MB" in str(info.value)


def test_a_memory_cap_excludes_configurations_that_do_not_fit_it(bundle, x):
    """A configuration larger than the cap used to be built anyway (and rebuilt every call)."""
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    needs = sorted({m.policy.memory_need_mb(c) for c in m.manifest.configurations})
    if len(needs) < 2:
        pytest.skip("every configuration of the test bundle needs the same memory")
    cap = (needs[0] + needs[1]) / 2
    capped = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB, memory_cap_mb=cap)
    for _ in range(3):
        p = capped.predict(x)
        assert capped.policy.memory_need_mb(capped.manifest.configuration(p.config_id)) <= cap


@pytest.mark.parametrize("threads", [2 ** 31, 0, -1, 1.5, "2", True], ids=repr)
def test_threads_out_of_range_is_a_config_error(bundle, threads):
    with pytest.raises(ConfigError, match=r"threads must be an integer in \[1, 1024\]"):
        edge_sdk.load(bundle, threads=threads)


@pytest.mark.parametrize("profile", [123, 1.5, ["auto"], {"name": "x"}], ids=repr)
def test_a_profile_of_the_wrong_type_is_a_profile_error(bundle, profile):
    with pytest.raises(ProfileError, match="profile must be 'auto', a built-in profile name"):
        edge_sdk.load(bundle, profile=profile)


@pytest.mark.parametrize("kw", [{"strict": "yes"}, {"strict": 1}, {"policy": ["best"]},
                                {"hysteresis": -0.1}, {"hysteresis": 1.5},
                                {"hysteresis": "0.1"}, {"half_life_s": 0},
                                {"half_life_s": math.nan}, {"half_life_calls": 0},
                                {"half_life_calls": 2.5}], ids=repr)
def test_other_load_arguments_are_typed(bundle, kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        edge_sdk.load(bundle, **kw)


def test_policy_tunables_reach_the_policy(bundle):
    m = edge_sdk.load(bundle, hysteresis=0.25, half_life_s=3.0, half_life_calls=50)
    assert (m.policy.hysteresis, m.policy.half_life_s, m.policy.half_life_calls) == \
        (0.25, 3.0, 50)


@pytest.mark.parametrize("cid", [["a"], 3, None.__class__, {"id": "w1.00-point"}], ids=repr)
def test_config_id_of_the_wrong_type_is_a_config_error(model, x, cid):
    with pytest.raises(ConfigError, match="config_id must be a configuration id"):
        model.predict(x, config_id=cid)
    with pytest.raises(ConfigError, match="config_id must be a configuration id"):
        model.predict_batch(np.stack([x]), config_id=cid)


def test_an_unknown_config_id_names_the_available_ones(model, x):
    with pytest.raises(BundleError, match="available"):
        model.predict(x, config_id="w9.99-point")


# --------------------------------------------------------------------------- input dtype
@pytest.fixture(scope="module")
def uint8_bundle(bundle, tmp_path_factory):
    """The test bundle with its input declared uint8 (the manifest is not checksummed, the
    digits' raw range 0..16 fits uint8)."""
    dst = tmp_path_factory.mktemp("u8") / "b"
    shutil.copytree(bundle, dst)
    data = read_manifest(dst, verify=False).to_dict()
    data["input"]["dtype"] = "uint8"
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


def test_a_uint8_bundle_refuses_float_input(uint8_bundle, x):
    m = edge_sdk.load(uint8_bundle, memory_reader=lambda: PLENTY_MB)
    scaled = (x / 16.0).astype(np.float32)  # an image pre-scaled to [0, 1]: accepted before
    with pytest.raises(InputError, match="declares uint8 input") as info:
        m.predict(scaled)
    assert "float32" in str(info.value)
    with pytest.raises(InputError, match="declares uint8 input"):
        m.predict_batch(np.stack([scaled, scaled]))
    with pytest.raises(InputError, match="declares uint8 input"):
        m.predict(x.astype(np.float64))  # even whole-valued floats: the dtype says uint8


def test_a_uint8_bundle_takes_its_integer_pixels(uint8_bundle, bundle, x):
    """Every configuration (its interpreters take uint8 and normalise in the graph, issue
    34) answers the pixels as the float bundle answers the same values; one sample and a
    batch; a pixel above the declared 0..16 is refused even though uint8 holds it."""
    m = edge_sdk.load(uint8_bundle, memory_reader=lambda: PLENTY_MB)
    ref = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    px = x.astype(np.uint8)
    batch = np.stack([px, np.minimum(px + 3, 16).astype(np.uint8), 16 - px])
    for c in (c.id for c in m.manifest.configurations):
        np.testing.assert_allclose(m.predict(px, config_id=c).probs,
                                   ref.predict(px.astype(np.float32), config_id=c).probs,
                                   atol=1e-6)
        np.testing.assert_allclose(m.predict_batch(batch, config_id=c).probs,
                                   ref.predict_batch(batch.astype(np.float32),
                                                     config_id=c).probs, atol=1e-6)
    with pytest.raises(InputError, match="raw range"):
        m.predict(np.full(x.shape, 17, np.uint8))


def test_a_float_bundle_takes_uint8_only_within_its_raw_range(model, x):
    assert model.input_spec.dtype == "float32"
    model.predict(x.astype(np.uint8))  # 8 is inside the digits' 0..16
    with pytest.raises(InputError, match="raw range"):
        model.predict(np.full(x.shape, 200, np.uint8))


# --------------------------------------------------------------------------- masked arrays, shapes
def test_a_masked_array_is_an_input_error(model, x):
    masked = np.ma.masked_array(x, mask=np.zeros(x.shape, bool))
    masked.mask[0, 0, 0] = True
    with pytest.raises(InputError, match="masked array"):
        model.predict(masked)
    with pytest.raises(InputError, match="masked array"):
        model.predict_batch(np.ma.stack([masked, masked]))


def test_a_batch_passed_to_predict_says_use_predict_batch(model, x):
    with pytest.raises(InputError, match="use predict_batch"):
        model.predict(np.stack([x, x, x]))
    with pytest.raises(InputError, match="use predict_batch"):
        model.predict(np.stack([x, x])[..., 0])  # grey [N, H, W]


def test_grey_models_take_hw_and_hw1_alike(model, x):
    a, b = model.predict(x[..., 0]), model.predict(x)
    assert a.label == b.label and a.probs == pytest.approx(b.probs, abs=1e-7)


# --------------------------------------------------------------------------- strict mode
def test_a_pinned_configuration_is_judged_against_its_budget(model, x):
    """It used to report budget_met=True for 0.34 ms against a 1e-6 ms budget."""
    c = model.manifest.configurations[0].id
    p = model.predict(x, Budget(latency_ms=1e-6), config_id=c)
    assert p.config_id == c and not p.budget_met
    assert model.predict(x, Budget(latency_ms=1e6), config_id=c).budget_met


def test_strict_mode_refuses_a_pinned_configuration_predicted_over_budget(bundle, x):
    m = edge_sdk.load(bundle, strict=True, memory_reader=lambda: PLENTY_MB)
    c = m.manifest.configurations[0].id
    with pytest.raises(BudgetNotMetError, match=r"over the latency budget 1e-06 ms"):
        m.predict(x, Budget(latency_ms=1e-6), config_id=c)
    with pytest.raises(BudgetNotMetError, match="MB short"):
        m.predict(x, Budget(memory_mb=1e-3), config_id=c)


def test_the_strict_memory_error_states_the_memory_shortfall(bundle, x):
    """It used to name a latency."""
    m = edge_sdk.load(bundle, strict=True, memory_reader=lambda: PLENTY_MB)
    smallest = min(m.policy.memory_need_mb(c) for c in m.manifest.configurations)
    with pytest.raises(BudgetNotMetError) as info:
        m.predict(x, Budget(memory_mb=smallest / 4))
    msg = str(info.value)
    assert f"needs {smallest:.4g} MB" in msg and f"{smallest * 3 / 4:.4g} MB short" in msg
    assert " ms" not in msg
    assert isinstance(info.value, BudgetError) and isinstance(info.value, EdgeSdkError)


# ------------------------------------------------------------- the lean path of feed_batch
@pytest.mark.parametrize("case", ["inside", "edges", "below", "above", "nan", "inf", "strided",
                                  "float64", "readonly"])
def test_feed_batch_takes_the_general_path_whenever_its_lean_one_would_differ(model, case):
    """InputChecker.feed_batch answers an exact-dtype, exact-shape batch inline (issue 34):
    the same values and the same refusal as the general check, for every kind of batch."""
    chk = model._inputs
    lo, hi = model.input_spec.value_range
    xs = np.random.default_rng(0).uniform(lo, hi, (6, *chk.want)).astype(np.float32)
    if case == "edges":
        xs[0], xs[1] = lo, hi
    elif case in ("below", "above", "nan", "inf"):
        xs[3, 0, 0, 0] = {"below": lo - 1, "above": hi + 1, "nan": np.nan, "inf": np.inf}[case]
    elif case == "strided":
        xs = np.concatenate([xs, xs])[::2]
        assert not xs.flags.c_contiguous
    elif case == "float64":
        xs = xs.astype(np.float64)
    elif case == "readonly":
        xs.setflags(write=False)

    def general():
        return np.ascontiguousarray(chk._checked(chk._batch(xs, "xs"), "xs"))

    if case in ("below", "above", "nan", "inf"):
        with pytest.raises(InputError) as want:
            general()
        with pytest.raises(InputError, match=f"^{re.escape(str(want.value))}$"):
            chk.feed_batch(xs)
        return
    got, ref = chk.feed_batch(xs), general()
    assert got.flags.c_contiguous and got.dtype == ref.dtype == chk.feed_dtype
    np.testing.assert_array_equal(got, ref)
