"""edge_sdk.runtime.model end to end, on a real bundle exported from a tiny digits model trained here.

Only the ``bundle`` fixture needs torch (it trains and exports); everything else runs on the
device install. With ``EDGE_SDK_TEST_BUNDLE`` set, the fixture reuses the bundle at that path
when it exists (the torch-free CI run) and otherwise exports it there (the main run).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import edge_sdk
from edge_sdk.answers import metrics as M
from edge_sdk.runtime import model as runtime
from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.errors import BudgetError, BundleError, ConfigError, EdgeSdkError, InputError
from edge_sdk.policy.budget import Budget
from runtime_support import invoke_clock

REPO_ROOT = Path(__file__).resolve().parents[2]
PLENTY_MB = 1e6


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def manifest(bundle) -> Manifest:
    return read_manifest(bundle)


@pytest.fixture(scope="module")
def model(bundle) -> runtime.EdgeModel:
    """Shared, only ever used with an unconstrained budget (its policy state is shared)."""
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)


@pytest.fixture(scope="module")
def xs(manifest) -> np.ndarray:
    """Real digits when scikit-learn is installed (plus a few random images), else random."""
    shape = tuple(manifest.input.shape[1:])
    lo, hi = manifest.input.value_range
    rng = np.random.default_rng(0)
    noise = rng.uniform(lo, hi, size=(8, *shape)).astype(np.float32)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return np.concatenate([noise, rng.integers(int(lo), int(hi) + 1, size=(32, *shape))
                               .astype(np.float32)])
    images = load_digits().images[:32].reshape(-1, *shape).astype(np.float32)
    return np.concatenate([images, noise])


def copy_bundle(bundle: Path, dst: Path) -> Path:
    shutil.copytree(bundle, dst)
    return dst


def with_thresholds(bundle: Path, dst: Path, thresholds: dict, plan=None) -> Path:
    """A copy of ``bundle`` whose every configuration has ``thresholds`` and, as cascade plan
    towards every wider configuration of its scope, ``plan`` (None: no plans, so the cascade
    climbs on thresholds). The manifest is not covered by a checksum: still a valid bundle."""
    copy_bundle(bundle, dst)
    data = read_manifest(dst).to_dict()
    for c in data["configurations"]:
        c["thresholds"] = dict(thresholds)
        c["cascade"] = {} if plan is None else {
            o["id"]: dict(plan) for o in data["configurations"]
            if o["scope"] == c["scope"] and o["width"] > c["width"]}
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


def widest(configs):
    return max(configs, key=lambda c: c.width)


def narrowest(configs):
    return min(configs, key=lambda c: c.width)


# --------------------------------------------------------------------------- verified loading


@pytest.fixture
def no_interpreter(monkeypatch):
    """Fails the test if the runtime gets as far as creating an interpreter."""
    def refuse():
        raise AssertionError("an interpreter was requested before the bundle was verified")

    monkeypatch.setattr(runtime, "interpreter_class", refuse)


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "extend"])
@pytest.mark.parametrize("which", [0, -1])  # the first file and the last (an 'all' sample)
def test_damaged_file_is_refused_before_use(bundle, manifest, tmp_path, no_interpreter,
                                            damage, which):
    copy = copy_bundle(bundle, tmp_path / "b")
    name = manifest.file_entries()[which].name
    path = copy / name
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-1]))
    elif damage == "extend":
        path.write_bytes(bytes(data) + b"\0")
    else:
        path.unlink()
    with pytest.raises(BundleError, match=name.replace(".", r"\.")):
        edge_sdk.load(copy)


def test_damaged_manifest_is_refused(bundle, tmp_path, no_interpreter):
    copy = copy_bundle(bundle, tmp_path / "b")
    text = (copy / MANIFEST_NAME).read_text()
    damaged = re.sub(r"(?m)^schema_version: \d+$", "schema_version: 99", text)
    assert damaged != text
    (copy / MANIFEST_NAME).write_text(damaged)
    with pytest.raises(BundleError, match="schema version"):
        edge_sdk.load(copy)
    (copy / MANIFEST_NAME).write_text(text[: len(text) // 2] + "\n  - [unclosed")
    with pytest.raises(BundleError):
        edge_sdk.load(copy)
    (copy / MANIFEST_NAME).write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(BundleError):
        edge_sdk.load(copy)
    (copy / MANIFEST_NAME).unlink()
    with pytest.raises(BundleError, match=MANIFEST_NAME):
        edge_sdk.load(copy)
    with pytest.raises(BundleError):
        edge_sdk.load(tmp_path / "nowhere")


def test_file_name_outside_the_bundle_is_refused(bundle, manifest, tmp_path, no_interpreter):
    copy = copy_bundle(bundle, tmp_path / "b")
    name = manifest.file_entries()[0].name
    shutil.move(copy / name, tmp_path / name)
    text = (copy / MANIFEST_NAME).read_text()
    (copy / MANIFEST_NAME).write_text(text.replace(f"name: {name}", f"name: ../{name}"))
    with pytest.raises(BundleError):
        edge_sdk.load(copy)
    # a symlink inside the bundle pointing out of it
    (copy / MANIFEST_NAME).write_text(text)
    (copy / name).symlink_to(tmp_path / name)
    with pytest.raises(BundleError, match="outside"):
        edge_sdk.load(copy)


def test_load_reports_backend_and_input_spec(model, manifest):
    assert model.backend in ("litert", "tflite-runtime")
    assert model.input_spec == manifest.input
    assert tuple(model.input_spec.shape) == (1, 8, 8, 1)


# --------------------------------------------------------------------------- input validation

SHAPE = (8, 8, 1)


def expect(match: str):
    return pytest.raises(InputError, match=match)


@given(shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=9).filter(
    lambda s: s not in (SHAPE, SHAPE[:2])))  # [8, 8]: a grey image, accepted
def test_wrong_shape_is_an_input_error(model, shape):
    with expect(r"shape \[8, 8, 1\]") as info:
        model.predict(np.ones(shape, np.float32))
    assert str(list(shape)) in str(info.value)


@pytest.mark.parametrize("bad", [
    np.ones(SHAPE, bool), np.ones(SHAPE, object), np.full(SHAPE, "1"), np.full(SHAPE, b"1"),
    np.ones(SHAPE, np.complex64), np.ones(SHAPE, "datetime64[s]"),
], ids=["bool", "object", "str", "bytes", "complex", "datetime"])
def test_wrong_dtype_is_an_input_error(model, bad):
    with expect(r"numeric \(uint8 or float\)") as info:
        model.predict(bad)
    assert str(bad.dtype) in str(info.value)


@given(value=st.sampled_from([math.nan, math.inf, -math.inf]),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]),
       index=st.tuples(st.integers(0, 7), st.integers(0, 7), st.just(0)))
def test_non_finite_is_an_input_error(model, value, dtype, index):
    x = np.ones(SHAPE, dtype)
    x[index] = value
    with expect("NaN or infinite"):
        model.predict(x)


@given(value=st.one_of(st.floats(-1e30, -1e-3), st.floats(16.001, 1e30)),
       dtype=st.sampled_from([np.float32, np.float64]),
       index=st.tuples(st.integers(0, 7), st.integers(0, 7), st.just(0)))
def test_values_outside_the_range_are_an_input_error(model, value, dtype, index):
    x = np.full(SHAPE, 3.0, dtype)
    x[index] = value
    with expect(r"range \[0, 16\]"):
        model.predict(x)


@pytest.mark.parametrize("bad", [np.full(SHAPE, 255, np.uint8), np.full(SHAPE, -1, np.int64),
                                 np.full(SHAPE, 2 ** 62, np.int64)])
def test_integer_values_outside_the_range_are_an_input_error(model, bad):
    with expect(r"range \[0, 16\]"):
        model.predict(bad)


@pytest.mark.parametrize("bad", [None, "digits", 3.0, [], {"x": 1},
                                 np.zeros((0, 8, 1)), np.zeros((1, 8, 8, 1)),
                                 np.zeros((10_000, 8, 8, 1), np.float32)],
                         ids=["none", "str", "scalar", "empty-list", "dict", "empty",
                              "batched", "huge-batch"])
def test_non_samples_are_input_errors(model, bad):
    with expect(r"8, 8, 1"):
        model.predict(bad)


def test_ragged_list_is_an_input_error(model):
    with pytest.raises(InputError):
        model.predict([[1, 2], [3]])


def test_ragged_list_message_names_the_expected_shape(model):
    with expect(r"8, 8, 1"):
        model.predict([[1, 2], [3]])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_huge_finite_value_names_the_range(model):
    with expect(r"range \[0, 16\]"):
        model.predict(np.full(SHAPE, 1e300))


@settings(max_examples=25)
@given(data=st.data(), dtype=st.sampled_from([np.uint8, np.int32, np.float16, np.float32,
                                              np.float64]))
def test_valid_inputs_in_any_numeric_dtype_are_accepted(model, data, dtype):
    x = data.draw(hnp.arrays(dtype, SHAPE, elements=st.integers(0, 16)))
    p = model.predict(x)
    ref = model.predict(x.astype(np.float32))
    assert p.probs == pytest.approx(ref.probs, abs=1e-6)
    assert model.predict(x.tolist()).label == p.label  # nested lists work too


def test_predict_batch_validates_its_batch(model, xs):
    with expect(r"\[N, 8, 8, 1\]"):
        model.predict_batch(xs[0])  # one sample, not a batch
    with expect(r"N >= 1"):
        model.predict_batch(np.zeros((0, *SHAPE), np.float32))
    bad = xs[:3].copy()
    bad[1, 0, 0, 0] = np.nan
    with expect("NaN"):
        model.predict_batch(bad)


def test_grey_images_without_the_channel_axis_answer_alike(model, manifest, xs):
    assert SHAPE[-1] == 1, "a grey model"
    for c in manifest.configurations:
        for x in xs[:4]:
            a, b = model.predict(x[..., 0], config_id=c.id), model.predict(x, config_id=c.id)
            assert (a.label, a.config_id) == (b.label, b.config_id)
            np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-6)
    batch = model.predict_batch(xs[:6, ..., 0])  # [N, H, W]
    assert [p.label for p in batch] == [p.label for p in model.predict_batch(xs[:6])]
    assert model.predict(xs[0, ..., 0].tolist()).label == batch[0].label  # nested lists too
    with expect(r"or \[8, 8\] for a grey image\), got \[8, 7\]"):
        model.predict(xs[0, :, :7, 0])
    with expect(r"or \[N, 8, 8\] for grey images"):
        model.predict_batch(xs[:2, :, :7, 0])


def test_predict_batch_ragged_list_is_an_input_error(model):
    with pytest.raises(InputError):
        model.predict_batch([np.zeros(SHAPE), np.zeros((8, 8))])


# --------------------------------------------------------------------------- predictions


def test_prediction_fields_hold_for_every_configuration(model, manifest, xs):
    log_c = math.log(manifest.num_classes)
    for c in manifest.configurations:
        for x in xs[::4]:
            p = model.predict(x, config_id=c.id)
            probs = np.array(p.probs)
            assert probs.shape == (manifest.num_classes,) and (probs >= 0).all()
            # float32: the answer's softmax runs in the interpreter (edge_sdk.answers.graph)
            assert probs.sum() == pytest.approx(1.0, abs=1e-6)
            assert p.confidence == probs.max()
            assert p.label == int(probs.argmax()) and isinstance(p.label, int)
            assert p.class_name == manifest.labels[p.label]
            assert -1e-12 <= p.entropy <= log_c + 1e-9
            assert p.mutual_info >= 0 and p.mutual_info <= p.entropy + 1e-12
            if c.scope == "point":
                assert p.mutual_info == 0
            assert (p.width, p.scope, p.samples, p.config_id) == (c.width, c.scope, c.samples,
                                                                    c.id)
            assert p.latency_ms >= 0
            d = json.loads(json.dumps(p.to_dict()))
            assert d["config_id"] == c.id and d["probs"] == list(p.probs)
            assert set(d) >= {"label", "class_name", "probs", "confidence", "entropy",
                              "mutual_info", "abstain", "width", "samples", "latency_ms",
                              "budget_met"}


def test_prediction_is_frozen(model, xs):
    p = model.predict(xs[0])
    with pytest.raises(AttributeError):
        p.label = 3  # type: ignore[misc]


def test_uncertainty_maths_match_edge_sdk_metrics(model, manifest, xs):
    """The runtime inlines softmax / entropy / MI: check them against edge_sdk.answers.metrics on the
    interpreter's own logits at the configuration's temperature."""
    sampled = [c for c in manifest.configurations if c.scope != "point"]
    assert sampled, "the bundle should have sampled configurations"
    for c in manifest.configurations:
        for x in xs[::8]:
            logits, _ = model._run(c, model._feed(x, "x"))
            assert logits.shape == (1 if c.scope == "point" else c.samples, manifest.num_classes)
            probs_s = M.softmax(logits.astype(np.float64), temperature=c.temperature)[:, None, :]
            p = model.predict(x, config_id=c.id)
            # point and head: the probabilities are the interpreter's float32 softmax
            # (edge_sdk.answers.graph), the all scope's numpy's float64 one
            tol = 1e-6 if c.scope in ("point", "head") else 1e-9
            assert p.probs == pytest.approx(probs_s.mean(0)[0].tolist(), abs=tol)
            assert p.entropy == pytest.approx(M.predictive_entropy(probs_s)[0], abs=tol)
            assert p.mutual_info == pytest.approx(M.mutual_information(probs_s)[0], abs=1e-9)


def test_unconstrained_budget_chooses_the_lowest_val_nll(bundle, manifest, xs):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    best = min(manifest.configurations, key=lambda c: (c.val_nll, -c.width, c.invokes))
    for x in xs[:5]:
        p = m.predict(x)
        assert (p.config_id, p.budget_met) == (best.id, True)


@pytest.mark.parametrize("target", [0.9, 0.95, 0.99])
def test_abstain_follows_the_exported_threshold(bundle, manifest, xs, target):
    m = edge_sdk.load(bundle, target_accuracy=target, memory_reader=lambda: PLENTY_MB)
    key = f"{target:g}"
    for c in manifest.configurations:
        threshold = c.thresholds[key]
        for x in xs[::2]:
            p = m.predict(x, config_id=c.id)
            # the default rule: below the confidence threshold, or out of distribution (issue
            # 33), or a suspect input (issue 34)
            assert p.abstain == (threshold is None or p.confidence < threshold
                                 or p.in_distribution is False or p.input_suspect is True), \
                (c.id, threshold)


def test_abstain_with_forced_thresholds(bundle, tmp_path, xs):
    forced = with_thresholds(bundle, tmp_path / "b", {"0.9": 0.0, "0.99": None, "0.95": 1.0})
    never = edge_sdk.load(forced, target_accuracy=0.9)
    always = edge_sdk.load(forced, target_accuracy=0.99)
    at_one = edge_sdk.load(forced, target_accuracy=0.95)
    for x in xs[::4]:
        p = never.predict(x)
        # only an input unlike the training data abstains
        assert p.abstain == (p.in_distribution is False or p.input_suspect is True)
        assert always.predict(x).abstain
        p = at_one.predict(x)
        assert p.abstain == (p.confidence < 1.0 or p.in_distribution is False
                             or p.input_suspect is True)


def test_unknown_target_accuracy_names_the_available_ones(bundle):
    # a load() argument: a ConfigError, as every other invalid target_accuracy (issue 51)
    with pytest.raises(ConfigError, match="^target_accuracy 0.5 ") as info:
        edge_sdk.load(bundle, target_accuracy=0.5)
    message = str(info.value)
    assert "0.5" in message
    for have in ("0.9", "0.95", "0.99"):
        assert have in message


def test_non_numeric_target_accuracy_is_a_typed_error(bundle):
    with pytest.raises(EdgeSdkError):
        edge_sdk.load(bundle, target_accuracy="0.95")


def test_unknown_policy_is_a_typed_error(bundle):
    with pytest.raises(EdgeSdkError, match="cascade"):
        edge_sdk.load(bundle, policy="fastest")


# --------------------------------------------------------------------------- budgets in the runtime


def test_budget_on_the_model_and_per_call(bundle, manifest, xs):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    narrow_mb = max(m.policy.memory_need_mb(c) for c in manifest.configurations if c.width < 1)
    wide_mb = min(m.policy.memory_need_mb(c) for c in manifest.configurations if c.width == 1)
    assert narrow_mb < wide_mb
    m.budget = Budget(memory_mb=(narrow_mb + wide_mb) / 2)
    assert m.predict(xs[0]).width < 1
    assert m.predict(xs[0], budget=Budget()).width == 1.0  # a per-call budget wins
    m.budget = Budget()
    assert m.predict(xs[0]).width == 1.0
    with pytest.raises(BudgetError):
        m.budget = 5  # type: ignore[assignment]
    with pytest.raises(BudgetError):
        m.predict(xs[0], budget=Budget(latency_ms=-1))


def test_low_available_memory_steps_the_width_down(bundle, manifest, xs):
    need = {c.id: c for c in manifest.configurations}
    probe = edge_sdk.load(bundle)
    narrow_mb = max(probe.policy.memory_need_mb(c) for c in manifest.configurations
                    if c.width < 1)
    m = edge_sdk.load(bundle, memory_reader=lambda: narrow_mb)
    p = m.predict(xs[0])
    assert p.width < 1 and p.budget_met
    assert probe.policy.memory_need_mb(need[p.config_id]) <= narrow_mb


def test_infeasible_budget_in_the_runtime(bundle, manifest, xs):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    # nothing fits memory: the smallest answers (then the fastest), ranked before the call
    # (the call's own measurement moves the estimate it is judged on)
    smallest = min(manifest.configurations,
                   key=lambda c: (m.policy.memory_need_mb(c), m.policy.predicted_latency_ms(c)))
    p = m.predict(xs[0], budget=Budget(memory_mb=1e-6))
    assert (p.config_id, p.budget_met) == (smallest.id, False)
    strict = edge_sdk.load(bundle, strict=True, memory_reader=lambda: PLENTY_MB)
    with pytest.raises(BudgetError, match="1e-06 MB"):
        strict.predict(xs[0], budget=Budget(memory_mb=1e-6))
    tiny = edge_sdk.load(bundle, memory_reader=lambda: 1e-3)  # nothing fits in RAM right now
    assert not tiny.predict(xs[0]).budget_met


def test_measured_latency_feeds_the_policy_and_budget_met(bundle, manifest, xs):
    m = invoke_clock(edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB), 2.0)
    p = m.predict(xs[0])
    assert p.latency_ms == pytest.approx(2.0)
    c = manifest.configuration(p.config_id)
    m.predict(xs[0], config_id=c.id)  # the first measurement is held, the second confirms
    assert m.policy.predicted_latency_ms(c) == pytest.approx(2.0)  # measured overrides manifest
    # predicted (manifest / MACs) fits 1.5 ms for some config, but every call measures 2 ms
    cheapest = min(m.policy.predicted_latency_ms(c) for c in manifest.configurations)
    if cheapest <= 1.5:
        assert not m.predict(xs[0], budget=Budget(latency_ms=1.5)).budget_met


# --------------------------------------------------------------------------- concurrency


def test_eight_threads_agree_with_sequential_calls(model, manifest, xs):
    ids = [c.id for c in manifest.configurations]
    jobs = [(i % len(xs), None if i % 3 else ids[i % len(ids)]) for i in range(600)]

    def run(job):
        i, cid = job
        p = model.predict(xs[i], config_id=cid)
        return p.label, p.probs, p.config_id, threading.get_ident()

    sequential = [run(j)[:3] for j in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(run, jobs))
    assert len({t for *_, t in concurrent}) > 1, "the jobs should run on several threads"
    for (label, probs, cid), (clabel, cprobs, ccid, _) in zip(sequential, concurrent):
        assert (clabel, ccid) == (label, cid)
        np.testing.assert_allclose(cprobs, probs, rtol=0, atol=1e-6)


def test_predict_batch_equals_individual_predicts(model, xs):
    batch = model.predict_batch(xs[:12])
    single = [model.predict(x) for x in xs[:12]]
    assert [(p.label, p.config_id) for p in batch] == [(p.label, p.config_id) for p in single]
    for a, b in zip(batch, single):
        np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-6)
    assert [p.label for p in model.predict_batch(list(xs[:3]))] == [p.label for p in single[:3]]


# --------------------------------------------------------------------------- cascade


@pytest.fixture(scope="module")
def forced(bundle, tmp_path_factory) -> Path:
    """0.9 never abstains (threshold 0), 0.99 always abstains (threshold None)."""
    return with_thresholds(bundle, tmp_path_factory.mktemp("forced") / "b",
                           {"0.9": 0.0, "0.95": 0.5, "0.99": None})


def cascade_ladder(manifest, best_id):
    best = manifest.configuration(best_id)
    ladder = [c for c in manifest.configurations if c.scope == best.scope and c.width <= best.width]
    return narrowest(ladder), widest(ladder)


def test_cascade_escalates_to_the_widest_when_always_unsure(forced, manifest, xs):
    m = edge_sdk.load(forced, target_accuracy=0.99, policy="cascade",
                      memory_reader=lambda: PLENTY_MB)
    best = edge_sdk.load(forced, memory_reader=lambda: PLENTY_MB).predict(xs[0]).config_id
    low, high = cascade_ladder(manifest, best)
    assert low.width < high.width, "the unconstrained choice should have a narrower sibling"
    for x in xs[:6]:
        p = m.predict(x)
        assert p.config_id == high.id and p.abstain
        assert p.probs == pytest.approx(m.predict(x, config_id=high.id).probs, abs=1e-6)


def test_cascade_stops_at_the_narrowest_when_sure(forced, manifest, xs):
    # random inputs are out of distribution: only the confidence rule is under test here
    m = edge_sdk.load(forced, target_accuracy=0.9, policy="cascade",
                      memory_reader=lambda: PLENTY_MB, abstain_on_ood=False)
    best = edge_sdk.load(forced, memory_reader=lambda: PLENTY_MB).predict(xs[0]).config_id
    low, high = cascade_ladder(manifest, best)
    assert low.width < high.width
    for x in xs[:6]:
        p = m.predict(x)
        assert p.config_id == low.id and not p.abstain and p.width == low.width


def test_cascade_escalates_only_below_the_exported_threshold(bundle, manifest, xs, tmp_path):
    """With the real thresholds and no plans: the narrow answer stands when it is confident
    enough, else the next width answers."""
    bundle = with_thresholds(bundle, tmp_path / "b", manifest.configurations[0].thresholds)
    m = edge_sdk.load(bundle, policy="cascade", memory_reader=lambda: PLENTY_MB)
    best = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB).predict(xs[0]).config_id
    low, high = cascade_ladder(manifest, best)
    key = f"{m.target_accuracy:g}"
    escalated = 0
    for x in xs:
        narrow = m.predict(x, config_id=low.id)
        p = m.predict(x)
        if low.thresholds[key] is not None and narrow.confidence >= low.thresholds[key]:
            assert p.config_id == low.id
            assert p.probs == pytest.approx(narrow.probs, abs=1e-6)
        else:
            escalated += 1
            assert p.config_id == high.id
            assert p.abstain == m.predict(x, config_id=high.id).abstain
    assert escalated < len(xs)


def test_cascade_stays_within_a_memory_budget(forced, manifest, xs):
    m = edge_sdk.load(forced, target_accuracy=0.99, policy="cascade",
                      memory_reader=lambda: PLENTY_MB)
    narrow_mb = max(m.policy.memory_need_mb(c) for c in manifest.configurations if c.width < 1)
    p = m.predict(xs[0], budget=Budget(memory_mb=narrow_mb))
    assert p.width < 1 and p.abstain and p.budget_met


def test_cascade_escalates_only_while_the_latency_budget_has_room(forced, manifest, xs):
    """Each invoke measures 1 ms (fake clock) and the thresholds always abstain. A budget that
    just fits the cheapest full-width configuration leaves no room after the narrow run (1 ms +
    its prediction > budget): the narrow answer stands. A roomy budget escalates."""
    for kind, rung in [("tight", narrowest), ("roomy", widest)]:
        # one model for the budget and the call: each load measures the SDK's overhead afresh
        m = invoke_clock(edge_sdk.load(forced, target_accuracy=0.99, policy="cascade",
                                      memory_reader=lambda: PLENTY_MB), 1.0)
        pred = m.policy.predicted_latency_ms
        budget = min(pred(c) for c in manifest.configurations if c.width == 1.0) \
            if kind == "tight" else 1.0 + max(pred(c) for c in manifest.configurations) + 1.0
        best = m.policy.decide(Budget(latency_ms=budget))[0]
        assert best.width == 1.0, "the best fitting configuration should be full width"
        low, high = cascade_ladder(manifest, best.id)
        p = m.predict(xs[0], budget=Budget(latency_ms=budget))
        assert p.config_id == rung([low, high]).id, budget
        # 1 ms per invoke: the narrow stage's, plus the wide one's when it escalated (the
        # ladder's scope follows the best configuration: an all scope runs S invokes a stage)
        spent = low.invokes + (high.invokes if kind == "roomy" else 0)
        assert p.latency_ms == pytest.approx(spent) and p.abstain


# ------------------------------------------------------------- two-stage cascade (plans)


def planned(bundle: Path, dst: Path, threshold, coverage: float) -> Path:
    return with_thresholds(bundle, dst, {"0.9": 0.0, "0.95": 0.5, "0.99": None},
                           {"threshold": threshold, "coverage": coverage, "max_loss": 0.002})


def unconstrained_best(bundle: Path):
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB).policy.choose(Budget())[0]


def test_two_stage_cascade_answers_from_the_first_stage_when_confident(bundle, xs, tmp_path):
    b = planned(bundle, tmp_path / "b", threshold=0.0, coverage=0.9)
    best = unconstrained_best(b)
    m = edge_sdk.load(b, policy="cascade", memory_reader=lambda: PLENTY_MB)
    pol = m.policy
    first = min((c for c in pol.configs if best.id in c.cascade),
                key=lambda c: pol.predicted_latency_ms(c) + 0.1 * pol.predicted_latency_ms(best))
    for x in xs[:5]:  # the first stage measured a few times: one timing spike on a shared
        m.predict(x, config_id=first.id)  # host does not decide the plan alone
    for x in xs[:6]:
        p = m.predict(x)
        assert p.config_id == first.id and p.width < best.width
        assert p.probs == pytest.approx(m.predict(x, config_id=first.id).probs, abs=1e-6)


def test_two_stage_cascade_runs_the_best_when_unsure(bundle, xs, tmp_path):
    """Threshold 1: the first stage is never sure enough; both stages run (1 ms each on the
    fake clock) and the rule's choice answers, never an intermediate width."""
    b = planned(bundle, tmp_path / "b", threshold=1.0, coverage=0.9)
    best = unconstrained_best(b)
    for x in xs[:4]:  # fresh each time: once both stages measure 1 ms, no first stage pays
        m = invoke_clock(edge_sdk.load(b, policy="cascade", memory_reader=lambda: PLENTY_MB),
                         1.0)
        p = m.predict(x)
        assert p.config_id == best.id and p.latency_ms == pytest.approx(2.0)


def test_two_stage_cascade_skips_a_first_stage_that_would_not_pay(bundle, xs, tmp_path):
    """Coverage 0: the expected latency L(first) + L(best) exceeds L(best); only best runs."""
    b = planned(bundle, tmp_path / "b", threshold=0.0, coverage=0.0)
    best = unconstrained_best(b)
    m = invoke_clock(edge_sdk.load(b, policy="cascade", memory_reader=lambda: PLENTY_MB), 1.0)
    p = m.predict(xs[0])
    assert p.config_id == best.id and p.latency_ms == pytest.approx(1.0)


def test_two_stage_cascade_keeps_the_first_answer_when_the_budget_has_no_room(bundle, xs,
                                                                            tmp_path):
    b = planned(bundle, tmp_path / "b", threshold=1.0, coverage=0.9)
    probe = edge_sdk.load(b, memory_reader=lambda: PLENTY_MB)
    budget = Budget(latency_ms=probe.policy.predicted_latency_ms(unconstrained_best(b)) * 1.01)
    best = probe.policy.choose(budget)[0]
    # the first stage eats the budget
    m = invoke_clock(edge_sdk.load(b, policy="cascade", memory_reader=lambda: PLENTY_MB),
                     budget.latency_ms)
    p = m.predict(xs[0], budget)
    assert p.width < best.width and p.latency_ms == pytest.approx(budget.latency_ms)


def test_two_stage_cascade_follows_the_exported_plan(bundle, manifest, xs):
    """On the real bundle's plans: the first stage answers exactly when its confidence
    reaches the plan's threshold."""
    best = unconstrained_best(bundle)
    if not any(best.id in c.cascade for c in manifest.configurations):
        pytest.skip("bundle exported before cascade plans existed")
    m = edge_sdk.load(bundle, policy="cascade", memory_reader=lambda: PLENTY_MB)
    firsts = set()
    for x in xs:
        p = m.predict(x)
        if p.config_id != best.id:
            c = manifest.configuration(p.config_id)
            assert p.confidence >= c.cascade[best.id]["threshold"]
            firsts.add(c.id)
    assert len(firsts) <= 1, "one first stage per (best, budget)"


# --------------------------------------------------------------------------- torch-free


BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("torch is blocked in this test", name=name)
            return None

    sys.meta_path.insert(0, BlockTorch())
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the torch blocker does not work")
""")


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_runtime_imports_without_torch():
    res = run_without_torch("""
        import edge_sdk, edge_sdk.runtime.model, edge_sdk.policy.policy, edge_sdk.bundle
        from edge_sdk import load, Budget, EdgeModel, Prediction
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        print("ok")
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_load_and_predict_without_torch(bundle):
    res = run_without_torch(f"""
        import json, numpy as np, edge_sdk
        m = edge_sdk.load({str(bundle)!r}, policy="cascade")
        p = m.predict(np.full((8, 8, 1), 3.0, np.float32), budget=edge_sdk.Budget(latency_ms=100))
        assert "torch" not in sys.modules
        print(json.dumps(p.to_dict()))
    """)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout.strip().splitlines()[-1])
    assert sum(d["probs"]) == pytest.approx(1.0)


def test_the_ready_interpreter_never_outlives_the_cache(bundle, xs):
    """Issue 34's one-lookup path (PerThread.ready): a one-sample call serves the resident
    batch-1 interpreter; a batch resizes it (the entry is dropped, the next call resizes it
    back and answers as before); with memory_cap_mb nothing is kept there (eviction and LRU
    order go through the cache)."""
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    c = next(c for c in m.manifest.configurations if c.scope == "point")
    first = [m.predict(x, config_id=c.id) for x in xs[:4]]
    assert m._local.ready[c.id][0][0] is m._local.cache[c.files[0].name][0][0]
    m.predict_batch(xs[:5], config_id=c.id)
    assert c.id not in m._local.ready  # resized to 5: not a batch-1 interpreter
    again = [m.predict(x, config_id=c.id) for x in xs[:4]]
    assert [p.label for p in again] == [p.label for p in first]
    np.testing.assert_array_equal([p.probs for p in again], [p.probs for p in first])
    (it, inp, *_), = m._local.ready[c.id]
    assert list(it.get_input_details()[0]["shape"]) == [1, *m.input_spec.shape[1:]]
    capped = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB, memory_cap_mb=1e5)
    capped.predict(xs[0], config_id=c.id)
    assert capped._local.ready == {}
