"""Issue 51, item 6 ("rough edges"): one error type per load() argument whatever is wrong with
its value; numpy numbers wherever Python numbers are taken; predict(None) and predict(path)
say what was passed; a batch's bad value names its row; the CLI's plain line shows what
--json holds that matters; BatchPrediction carries the call's own fields, to_dict() and
slices as a batch; the docs say what is true. Real bundle, no torch."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.answers.prediction import BatchPrediction, Prediction
from edge_sdk.backends import BackendError
from edge_sdk.cli.device import abstain_reasons, plain_line
from edge_sdk.cli.main import main
from edge_sdk.errors import (BudgetError, BundleError, ConfigError, InputError, ProfileError,
                             SigningKeyError)
from edge_sdk.policy.budget import Budget
from edge_sdk.validation import real_value
from test_runtime_bad_inputs import PLENTY_MB, model  # noqa: F401 (model: a fixture)

ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def xs(model):
    lo, hi = model.input_spec.value_range
    return np.random.default_rng(0).uniform(lo, hi, (64, *model.input_spec.shape[1:])
                                            ).astype(np.float32)


@pytest.fixture(scope="module")
def x(xs):
    return xs[0]


# ----------------------------------------------------------- one error type per load() argument
BAD_LOAD_ARGUMENTS = [
    # (argument, the type every invalid value of it raises, bad values)
    ("target_accuracy", ConfigError, [0.5, 0.123, "0.95", True, np.bool_(True), math.nan, 0,
                                      -0.1, 1.5, None, 10 ** 400, [0.95]]),
    ("memory_cap_mb", ConfigError, [-1, 0, "x", True, np.bool_(True), math.nan, math.inf,
                                    10 ** 400, [3], 1e-9]),
    ("policy", ConfigError, ["fastest", 5, None, ["best"]]),
    ("threads", ConfigError, [0, -1, 2 ** 31, 1.5, 2.0, "2", True, np.bool_(True),
                              np.float64(2)]),
    ("strict", ConfigError, ["yes", 1, None]),
    ("uncertainty", ConfigError, ["yes", 1, None]),
    ("abstain_on_ood", ConfigError, ["yes", 0]),
    ("input_check", ConfigError, ["no", 0]),
    ("conformal", ConfigError, ["x", 1, None, "LAC"]),
    ("hysteresis", ConfigError, [-0.1, 1.5, "0.1", True, math.nan, 10 ** 400]),
    ("half_life_s", ConfigError, [0, -1, math.nan, math.inf, "10", True]),
    ("half_life_calls", ConfigError, [0, 2.5, "200", True, 10 ** 400]),
    ("alpha", ConfigError, [0.7, 0.0, "0.1", True, math.nan]),
    ("backend", ConfigError, ["litrt", "onnx", 5, ["litert"]]),
    ("memory_reader", ConfigError, [5, "psutil"]),
    ("clock", ConfigError, ["x", 1.0]),
    ("bundle_dir", ConfigError, [5, None, ["runs/demo/bundle"]]),
    ("profile", ProfileError, [123, 1.5, ["auto"], "no_such_profile", "/no/such/profile.yaml"]),
    ("trusted_keys", SigningKeyError, [5, "/no/such/key.pem", b"not a key"]),
]
CASES = [(arg, err, bad) for arg, err, bads in BAD_LOAD_ARGUMENTS for bad in bads]


@pytest.mark.parametrize("arg, error, bad", CASES,
                         ids=[f"{a}={b!r}"[:60] for a, _, b in CASES])
def test_every_invalid_value_of_a_load_argument_raises_its_one_type(bundle, arg, error, bad):
    kw = {"bundle_dir": bundle, arg: bad}
    if arg == "trusted_keys":
        pytest.importorskip("cryptography")
    with pytest.raises(error) as info:
        edge_sdk.load(**kw)
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    # every one of them is a ConfigError (ProfileError and SigningKeyError derive from it),
    # and none a BudgetError: a bad budget is a Budget field or a per-call budget
    assert isinstance(info.value, ConfigError) and not isinstance(info.value, BudgetError)
    message = str(info.value)
    # the argument by name ("trusted key /x.pem ..." for one of trusted_keys)
    names = {"trusted_keys": "trusted[ _]key"}
    assert re.search(names.get(arg, arg), message), message


def test_the_reported_inconsistency_target_accuracy_half_and_a_string(bundle):
    """target_accuracy=0.5 raised BudgetError, '0.95' ConfigError."""
    for bad in (0.5, "0.95"):
        with pytest.raises(ConfigError, match="^target_accuracy"):
            edge_sdk.load(bundle, target_accuracy=bad)


def test_what_a_valid_argument_points_at_keeps_its_own_type(bundle, tmp_path, monkeypatch):
    with pytest.raises(BundleError, match="not found"):  # the bundle, not the argument
        edge_sdk.load(tmp_path / "nothing")
    from edge_sdk import backends

    def missing(name):
        raise BackendError(f"{name} is not installed")
    monkeypatch.setattr(backends, "_import", missing)
    with pytest.raises(BackendError, match="not installed"):  # a valid name, not here
        edge_sdk.load(bundle, backend="tflite-runtime")


# ------------------------------------------------------------------ numpy numbers, never bools
@pytest.mark.parametrize("kw, attr, want", [
    ({"target_accuracy": np.float64(0.95)}, "target_accuracy", 0.95),
    ({"target_accuracy": np.float32(0.95)}, "target_accuracy", 0.95),  # the decimal written
    ({"target_accuracy": np.float32(0.9)}, "target_accuracy", 0.9),
    ({"memory_cap_mb": np.int64(50)}, "memory_cap_mb", 50.0),
    ({"memory_cap_mb": np.float32(50.5)}, "memory_cap_mb", 50.5),
    ({"threads": np.int64(2)}, "threads", 2),
    ({"threads": np.uint8(1)}, "threads", 1),
    ({"alpha": np.float32(0.1)}, "alpha", 0.1),
], ids=repr)
def test_numpy_numbers_are_taken_as_python_ones(bundle, kw, attr, want):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB, **kw)
    got = getattr(m, attr)
    assert got == want and type(got) is type(want), (got, type(got))


def test_numpy_policy_tunables(bundle):
    m = edge_sdk.load(bundle, hysteresis=np.float32(0.25), half_life_s=np.float64(3),
                      half_life_calls=np.int64(50))
    assert (m.policy.hysteresis, m.policy.half_life_s, m.policy.half_life_calls) == \
        (0.25, 3.0, 50)


@pytest.mark.parametrize("kw, want", [
    ({"latency_ms": np.float32(2)}, Budget(latency_ms=2.0)),
    ({"latency_ms": np.float32(0.1)}, Budget(latency_ms=0.1)),
    ({"memory_mb": np.int64(50)}, Budget(memory_mb=50.0)),
    ({"latency_ms": np.float64(1.5), "memory_mb": np.int32(8)}, Budget(1.5, 8.0)),
], ids=repr)
def test_a_budget_takes_numpy_numbers(kw, want):
    b = Budget(**kw)
    assert b == want and all(type(v) is float for v in (b.latency_ms, b.memory_mb)
                             if v is not None)


@pytest.mark.parametrize("bad", [True, np.bool_(True), "2", None.__class__, [2.0]], ids=repr)
def test_a_budget_refuses_bools_and_non_numbers(bad):
    with pytest.raises(BudgetError, match="Budget.latency_ms must be a positive number"):
        Budget(latency_ms=bad)


@pytest.mark.parametrize("v, want", [(1.5, 1.5), (3, 3.0), (np.float32(0.95), 0.95),
                                     (np.float16(0.5), 0.5), (np.int64(7), 7.0),
                                     (10 ** 400, math.inf), (-(10 ** 400), -math.inf),
                                     (True, None), (np.bool_(False), None), ("1", None),
                                     (None, None), (1 + 0j, None)], ids=repr)
def test_real_value(v, want):
    assert real_value(v) == want


def test_width_takes_numpy_numbers_and_refuses_bools(model, x):
    want = model.predict(x, width=0.5).width
    for w in (np.float64(0.5), np.float32(0.5)):
        assert model.predict(x, width=w).width == want
        assert model.predict_batch(np.stack([x, x]), width=w).labels.shape == (2,)
    for bad in (True, np.bool_(True)):
        with pytest.raises(ConfigError, match="width must be a number"):
            model.predict(x, width=bad)


# ------------------------------------------------------------------- None and paths to predict
@pytest.mark.parametrize("bad, says", [
    (None, r"^x is None; predict\(\) takes the sample values: an array of shape \[8, 8, 1\]$"),
    ("x.npy", (r"^x is str \('x\.npy'\), not an array: predict\(\) takes the sample values "
               r"\[8, 8, 1\]; read the file first: np\.load\(path\)")),
    (Path("x.npy"), r"^x is a path \(\w*Path\('x\.npy'\)\), not an array"),
    (b"x.npy", r"^x is bytes \(b'x\.npy'\), not an array"),
    (5, r"^x must be an array of shape \[8, 8, 1\]; got int 5, not an array$"),
    (object(), r"^x must be an array of shape \[8, 8, 1\]; got object <object"),
], ids=repr)
def test_predict_of_none_or_a_path_says_what_was_passed(model, bad, says):
    """Both said 'must have shape [8, 8, 1] ... got []'."""
    if tuple(model.input_spec.shape[1:]) != (8, 8, 1):
        pytest.skip("the messages are written for the digits bundle")
    with pytest.raises(InputError, match=says) as info:
        model.predict(bad)
    assert "got []" not in str(info.value)
    if isinstance(bad, (str, Path)):
        assert "edge_sdk.inputs.files.read_input(path, model.input_spec)" in str(info.value)


@pytest.mark.parametrize("bad", [None, "xs.npy", Path("xs.npy")], ids=repr)
def test_predict_batch_of_none_or_a_path_says_what_was_passed(model, bad):
    with pytest.raises(InputError, match=r"^xs is .*predict_batch\(\) takes the sample "
                                         r"values.*\[N, 8, 8, 1\]"):
        model.predict_batch(bad)


# -------------------------------------------------------------- a batch's bad value: its row
@pytest.mark.parametrize("value, says", [(np.nan, "contains NaN or infinite values"),
                                         (np.inf, "contains NaN or infinite values"),
                                         (-np.inf, "contains NaN or infinite values"),
                                         (99.0, "values must lie in the raw range"),
                                         (-3.0, "values must lie in the raw range")])
def test_a_bad_value_in_a_large_batch_names_its_first_row_and_the_count(model, x, value,
                                                                          says):
    xs = np.repeat(x[None], 10_000, axis=0)
    for row in (7321, 4123, 9999):
        xs[row, 2, 3] = value
    with pytest.raises(InputError, match=re.escape(says)) as info:
        model.predict_batch(xs)
    which = "with one" if "NaN" in says else "outside it"
    assert str(info.value).endswith(f": row 4123 (the first of 3 of 10000 rows {which})"), \
        str(info.value)


def test_a_uint8_batch_out_of_range_names_its_row(model, x):
    """Integers take the same path (a bundle whose range is narrower than uint8's)."""
    _, hi = model.input_spec.value_range
    if hi >= 255:
        pytest.skip("the bundle's range covers uint8's")
    xs = np.repeat(np.clip(np.rint(x), 0, 255).astype(np.int32)[None], 50, axis=0)
    xs[12, 0, 0] = int(hi) + 100
    with pytest.raises(InputError, match=r": row 12 \(the first of 1 of 50 rows outside it\)$"):
        model.predict_batch(xs)


def test_one_sample_is_reported_as_before(model, x):
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError, match=r"^x contains NaN or infinite values$"):
        model.predict(bad)


# ------------------------------------------------------------------------ the CLI's plain line
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))


def _fields(line: str) -> list[str]:
    return line.split("\t")


def test_the_plain_line_shows_what_json_holds_that_matters(bundle, x, tmp_path, capsys,
                                                             private_cache):
    path = tmp_path / "x.npy"
    np.save(path, np.stack([x, x / 16]))  # the second: every value in range, image too dark
    assert main(["run", str(bundle), "--input", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert main(["run", str(bundle), "--input", str(path), "--json"]) == 0
    objs = [json.loads(ln) for ln in capsys.readouterr().out.strip().splitlines()]
    labels = edge_sdk.load(bundle).manifest.labels
    assert len(lines) == len(objs) == 2
    for line, d in zip(lines, objs):
        f = _fields(line)
        assert f[0] == d["class_name"] and f[1] == f"confidence {d['confidence']:.4f}"
        assert not any(v.startswith("MI ") for v in f) or d["samples"] > 1  # points: no MI
        if d["ood_score"] is not None:
            flag = "in distribution" if d["in_distribution"] else "OUT OF DISTRIBUTION"
            assert f"ood {d['ood_score']:.4f} {flag}" in f
        if d["prediction_set"] is not None:
            assert "set {" + ", ".join(labels[i] for i in d["prediction_set"]) + "}" in f
        assert ("INPUT SUSPECT (raw statistics unlike the training data's)" in f) == \
            bool(d["input_suspect"])
        assert (f[2] == "ok") == (not d["abstain"])
        assert d["config_id"] in f and f[-1] in ("budget met", "budget MISSED")
    suspect = _fields(lines[1])
    if objs[1]["input_suspect"]:  # x / 16 on a bundle with input statistics
        assert suspect[2].startswith("ABSTAIN (") and "input suspect" in suspect[2]


def _point(model, x) -> Prediction:
    cid = next(c.id for c in model.manifest.configurations if c.scope == "point")
    return model.predict(x, config_id=cid)


def test_why_it_abstained(model, x):
    p = _point(model, x)
    threshold = model.manifest.configuration(p.config_id).thresholds["0.95"]
    assert threshold is not None
    low = dataclasses.replace(p, confidence=threshold / 2, abstain=True, in_distribution=True,
                              input_suspect=False)
    assert abstain_reasons(low, model) == [
        f"low confidence: below {threshold:g} for target accuracy 0.95"]
    ood = dataclasses.replace(p, confidence=1.0, abstain=True, in_distribution=False,
                              ood_score=0.5, input_suspect=False)
    assert abstain_reasons(ood, model) == ["out of distribution"]
    line = plain_line(ood, model)
    assert "\tABSTAIN (out of distribution)\tood 0.5000 OUT OF DISTRIBUTION\t" in line
    both = dataclasses.replace(low, in_distribution=False, input_suspect=True)
    assert "ABSTAIN (low confidence: below" in plain_line(both, model)
    assert "; out of distribution; input suspect)" in plain_line(both, model)
    assert "\tINPUT SUSPECT (" in plain_line(both, model)
    ok = dataclasses.replace(p, confidence=1.0, abstain=False, in_distribution=True,
                             ood_score=-0.9, input_suspect=False)
    f = _fields(plain_line(ok, model))
    assert f[2] == "ok" and "ood -0.9000 in distribution" in f
    assert not any("SUSPECT" in v for v in f) and not any(v.startswith("MI ") for v in f)


def test_the_mutual_information_only_where_the_configuration_samples(model, x):
    sampled = [c.id for c in model.manifest.configurations if c.samples > 1]
    if not sampled:
        pytest.skip("the bundle has no sampled configuration")
    p = model.predict(x, config_id=sampled[0])
    assert f"\tMI {p.mutual_info:.5f}\t" in plain_line(p, model)
    assert "\tMI " not in plain_line(_point(model, x), model)


# ----------------------------------------------------------------- BatchPrediction, the call's
def _check_call_fields(b, n):
    assert isinstance(b, BatchPrediction) and len(b) == n
    assert isinstance(b.config_id, str) and b.config_id
    assert isinstance(b.latency_ms, float) and b.latency_ms > 0
    assert isinstance(b.budget_met, bool) and isinstance(b.invoke_ms, float)
    assert b.config_ids.shape == (n,) and set(b.config_ids.tolist()) <= {
        s for s in b.stage_ids}
    assert b.config_id in b.config_ids.tolist()
    for p in b:
        assert (p.latency_ms, p.invoke_ms, p.budget_met) == (b.latency_ms, b.invoke_ms,
                                                              b.budget_met)
    assert b.config_ids.tolist() == [p.config_id for p in b]
    with pytest.raises(ValueError):
        b.config_ids[0] = "x"  # read-only, as every array of it


@pytest.mark.parametrize("n", [1, 2, 64])
def test_a_batch_carries_the_call_fields(model, xs, n):
    b = model.predict_batch(xs[:n], Budget(latency_ms=1e4))
    _check_call_fields(b, n)
    assert b.stage_ids == (b.config_id,) and b.budget_met


def test_a_cascade_batch_names_its_last_stage(bundle, xs):
    m = edge_sdk.load(bundle, policy="cascade", memory_reader=lambda: PLENTY_MB)
    b = m.predict_batch(xs)
    _check_call_fields(b, len(xs))
    answered = set(b.config_ids.tolist())
    # the last stage of the plan that answered anything
    assert b.config_id == [s for s in b.stage_ids if s in answered][-1]
    for cid in answered:
        assert (b.config_ids == cid).sum() == sum(p.config_id == cid for p in b)


def test_a_batch_made_of_two_configurations_names_the_last_stage(model, xs):
    ids = [c.id for c in model.manifest.configurations if c.scope == "point"]
    narrow, wide = sorted(ids, key=lambda cid: model.manifest.configuration(cid).width)[:2]
    preds = [model.predict(xs[0], config_id=narrow), model.predict(xs[1], config_id=wide),
             model.predict(xs[2], config_id=narrow)]
    b = BatchPrediction(preds, len(model.manifest.labels), stage_ids=(narrow, wide))
    assert b.config_id == wide and b.config_ids.tolist() == [narrow, wide, narrow]
    b = BatchPrediction(preds, len(model.manifest.labels), stage_ids=(wide, narrow))
    assert b.config_id == narrow  # the plan's order decides, not the widths
    assert BatchPrediction(preds, len(model.manifest.labels)).config_id == wide  # no plan
    assert b[:1].config_id == narrow and b[1:2].config_id == wide


def test_to_dict_is_json_and_consistent_with_prediction_to_dict(model, xs):
    b = model.predict_batch(xs[:5])
    d = json.loads(json.dumps(b.to_dict()))
    assert d == {"size": 5, "config_id": b.config_id, "stage_ids": list(b.stage_ids),
                 "latency_ms": b.latency_ms, "invoke_ms": b.invoke_ms,
                 "budget_met": b.budget_met,
                 "predictions": [json.loads(json.dumps(p.to_dict())) for p in b]}
    assert [p["label"] for p in d["predictions"]] == b.labels.tolist()


@pytest.mark.parametrize("uncertainty", [True, False])
@pytest.mark.parametrize("s", [slice(None, 3), slice(2, 7), slice(None, None, 2),
                               slice(-3, None), slice(5, 5), slice(None, None, -1)],
                         ids=repr)
def test_a_slice_is_a_batch_prediction_of_those_samples(bundle, xs, uncertainty, s):
    m = edge_sdk.load(bundle, uncertainty=uncertainty, memory_reader=lambda: PLENTY_MB)
    for b in (m.predict_batch(xs[:9]), edge_sdk.load(
            bundle, policy="cascade", uncertainty=uncertainty,
            memory_reader=lambda: PLENTY_MB).predict_batch(xs[:9])):
        whole = list(b)
        part = b[s]
        assert isinstance(part, BatchPrediction) and len(part) == len(whole[s])
        assert part == whole[s] and list(part) == whole[s]  # the same predictions
        for name in ("labels", "confidence", "probs", "abstain", "entropy", "mutual_info",
                     "ood_score", "in_distribution", "prediction_sets", "input_suspect",
                     "config_ids"):
            a, w = getattr(part, name), getattr(b, name)
            assert (a is None) == (w is None), name
            if a is not None:
                np.testing.assert_array_equal(a, w[s])
                assert not a.flags.writeable, name
        assert (part.latency_ms, part.budget_met, part.stage_ids) == \
            (b.latency_ms, b.budget_met, b.stage_ids)
        assert isinstance(part.config_id, str) and part.config_id
        json.dumps(part.to_dict())
        assert part[:1] == whole[s][:1]  # a slice of a slice


def test_a_slice_before_anything_is_read_computes_lazily(model, xs):
    """A slice of an untouched batch makes its predictions and entropies on first read, as
    the whole batch would (no per-sample work when it is made)."""
    b = model.predict_batch(xs[:9])
    part = b[3:6]
    assert part._preds is None and b._preds is None
    np.testing.assert_array_equal(part.entropy, model.predict_batch(xs[:9]).entropy[3:6])
    assert [p.label for p in part] == b.labels[3:6].tolist()
    assert part[0].batch_size == 9  # the call's batch size, as its per-sample predictions say


# ------------------------------------------------------------------------------- the docs true
def test_probs_are_float64_and_the_docs_say_so(model, x, xs):
    assert model.predict(x).probs.dtype == np.float64
    assert model.predict_batch(xs[:3]).probs.dtype == np.float64
    text = (ROOT / "docs" / "runtime.md").read_text()
    assert "so those probabilities are float32." not in text
    assert "hand every answer's back as float64" in text


def test_no_doc_names_an_explain_command():
    """It is `edge-sdk run --explain`; there is no `edge-sdk explain`."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "edge_sdk").rglob("*.py"))]
    found = [str(p.relative_to(ROOT)) for p in pages
             if re.search(r"edge-sdk\s+explain", p.read_text(encoding="utf-8"))]
    assert found == []
