"""Precision as part of a configuration: a store bundle whose point slices come in float,
dynamic-range and int8 kernels (schema version 7), materialised on the device byte for byte as
exported, answering alike; the policy treats a network's equivalent variants as one choice and
answers with the one judged fastest; a width pinned without its precision gets that one."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import edge_sdk
from edge_sdk.bundle import MANIFEST_NAME, SCHEMA_VERSION, read_manifest
from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.policy.budget import MemoryProbe
from edge_sdk.policy.policy import Policy
from edge_sdk.policy.variants import RECHECK_CALLS

PLENTY_MB = 1e6


@pytest.fixture(scope="module")
def model(precision_bundle):
    return edge_sdk.load(precision_bundle, profile=None, memory_reader=lambda: PLENTY_MB)


@pytest.fixture(scope="module")
def xs(model):
    rng = np.random.default_rng(0)
    lo, hi = model.manifest.input.value_range
    return rng.uniform(lo, hi, (64, *model.manifest.input.shape[1:])).astype(np.float32)


def test_every_width_has_its_point_slice_in_three_precisions(precision_bundle, model):
    m = model.manifest
    assert m.schema_version == SCHEMA_VERSION and m.is_store  # what the exporter writes
    by_width: dict[float, set[str]] = {}
    for c in m.configurations:
        by_width.setdefault(c.width, set()).add(c.precision)
        assert c.id.endswith({"float": "-point", "dynamic": "-point-dyn",
                              "int8": "-point-int8"}[c.precision])
    assert all(p == {"float", "dynamic", "int8"} for p in by_width.values())
    # the device builds each width's integer slice with the scales the export calibrated
    assert set(m.activation_quant) == {"0.50", "1.00"}
    for per in m.activation_quant.values():
        assert per["input"][0] > 0 and all(-128 <= z <= 127 for _, z in per.values())


def test_the_variants_answer_as_their_float_slice_does(model, xs):
    m = model.manifest
    for c in m.configurations:
        if c.precision == "float" or c.id in model.left_out:  # (tflite-runtime: no dynamic)
            continue
        ref = next(f for f in m.configurations if f.variant_of == c.variant_of
                   and f.precision == "float")
        got = model.predict_batch(xs, config_id=c.id)
        want = model.predict_batch(xs, config_id=ref.id)
        assert (np.asarray(got.labels) == np.asarray(want.labels)).mean() >= 0.9, c.id
        assert np.abs(np.asarray(got.probs) - np.asarray(want.probs)).max() < 0.25, c.id
        assert got.ood_score is not None  # the width's bank scores every precision's features


def test_equivalent_variants_are_one_choice_answered_by_the_fastest(precision_bundle):
    model = edge_sdk.load(precision_bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    pol = model.policy
    points = [c for c in pol.configs if c.scope == "point"]
    runnable = 3 - len(model.left_out) // 2  # a backend may leave a precision out (2 widths)
    for c in points:
        group = pol.variants(c)
        assert {v.variant_of for v in group} == {c.variant_of} and len(group) == runnable
        active = pol.active_variant(c)
        assert active in group and active in pol._ranked
        assert sum(v in pol._ranked for v in group) == 1  # one of them stands for the network
    assert len(pol.ranked) == len(pol.configs)  # explain() lists every variant
    c = points[0]
    predicted = {v.id: pol.predicted_latency_ms(v) for v in pol.variants(c)}
    active = pol.active_variant(c).id
    assert predicted[active] == min(predicted.values())  # (no measurement yet: the priors)
    x = np.zeros(model.manifest.input.shape[1:], np.float32)
    assert model.predict(x, width=c.width).config_id == active


def test_a_variant_measured_slow_hands_the_width_to_a_faster_one(precision_bundle):
    m = edge_sdk.load(precision_bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    pol = m.policy
    c = next(c for c in pol.configs if c.scope == "point")
    first = pol.active_variant(c)
    for _ in range(RECHECK_CALLS + 1):  # sustained: many times every other variant's estimate
        pol.observe(first.id, 1e3 * max(pol.predicted_latency_ms(v) for v in pol.variants(c)))
    after = pol.active_variant(c)
    assert after is not first and after in pol.variants(c)
    x = np.zeros(m.manifest.input.shape[1:], np.float32)
    assert m.predict(x, width=c.width).config_id == after.id


def test_a_variant_that_loses_quality_is_a_configuration_of_its_own(model):
    configs = model.manifest.configurations
    c = next(c for c in configs if c.precision == "int8")
    worse = [x if x is not c else type(x).from_dict({**x.to_dict(), "val_nll": x.val_nll + 1})
             for x in configs if x.id not in model.left_out]
    pol = Policy(worse, MemoryProbe(lambda: PLENTY_MB))
    loser = next(x for x in pol.configs if x.id == c.id)
    assert pol.variants(loser) == (loser,) and loser in pol._ranked
    others = [x for x in pol.configs if x.variant_of == c.variant_of and x.id != c.id]
    assert all(pol.variants(x) == (tuple(others) if len(others) > 1 else (x,)) for x in others)


def test_a_pinned_width_is_checked(model):
    x = np.zeros(model.manifest.input.shape[1:], np.float32)
    with pytest.raises(ConfigError, match="config_id or width, not both"):
        model.predict(x, config_id="w0.50-point", width=0.5)
    with pytest.raises(ConfigError, match=r"no point configuration of width 0.25; .* 0.50, 1.00"):
        model.predict(x, width=0.25)
    for bad in (True, 0, 1.5, "0.5", float("nan")):
        with pytest.raises(ConfigError, match="width must be a number in"):
            model.predict_batch(x[None], width=bad)


def test_an_integer_store_slice_without_its_scales_is_refused(precision_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(precision_bundle, b)
    data = yaml.safe_load((b / MANIFEST_NAME).read_text())
    del data["activation_quant"]["0.50"]
    (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(BundleError, match=r"needs activation_quant\['0.50'\]"):
        read_manifest(b, verify=False)
    data["schema_version"] = 6
    del data["activation_quant"]
    for c in data["configurations"]:  # (version 8's per-target plans, version 10's
        c.pop("val_accuracy", None)     # validation accuracy: not under test here)
        for e in c.get("cascade", {}).values():
            e.pop("targets", None)
    (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(BundleError, match="'int8' needs schema version 7"):
        read_manifest(b, verify=False)


def test_per_target_cascade_plans_need_schema_version_8(precision_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(precision_bundle, b)
    data = yaml.safe_load((b / MANIFEST_NAME).read_text())
    c = next(c for c in data["configurations"] if c.get("cascade"))
    wider = next(iter(c["cascade"]))
    c["cascade"][wider]["targets"] = {"0.9": {"threshold": 0.1, "coverage": 1.0}}
    data["schema_version"] = 7
    for other in data["configurations"]:  # (version 10's: not under test here)
        other.pop("val_accuracy", None)
    (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(BundleError, match=f"cascade.{wider}.targets: needs schema version 8"):
        read_manifest(b, verify=False)


def test_bad_activation_scales_name_their_key(precision_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(precision_bundle, b)
    data = yaml.safe_load((b / MANIFEST_NAME).read_text())
    for bad, match in (([0.0, 0], r"activation_quant\['0\.50'\]\.input\[0\]: expected a "
                                  r"positive"),
                       ([0.1, 300], r"activation_quant\['0\.50'\]\.input\[1\]"),
                       ([0.1], r"expected \[scale, zero point\]")):
        data["activation_quant"]["0.50"]["input"] = bad
        (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
        with pytest.raises(BundleError, match=match):
            read_manifest(b, verify=False)


def test_an_altered_scale_makes_the_materialised_slice_fail_its_checksum(precision_bundle,
                                                                         tmp_path):
    b = tmp_path / "b"
    shutil.copytree(precision_bundle, b)
    data = yaml.safe_load((b / MANIFEST_NAME).read_text())
    scale, zero = data["activation_quant"]["1.00"]["input"]
    data["activation_quant"]["1.00"]["input"] = [scale * 1.5, zero]
    (b / MANIFEST_NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(BundleError, match="checksum mismatch|sha256"):
        edge_sdk.load(b, profile=None)


def test_the_precision_bundle_is_what_the_manifest_says(precision_bundle):
    m = read_manifest(precision_bundle)  # every stored file verified
    assert Path(precision_bundle, m.store.name).stat().st_size == m.store.bytes


def test_materialised_to_files_every_precision_answers_alike_and_outside_edge_sdk(
        precision_bundle, tmp_path, xs):
    """``edge-sdk materialize``: the integer and dynamic-range slices written as plain
    ``.tflite`` files (the same sha256), which the plain-interpreter example of
    docs/predict_with_litert.py runs as ``predict`` answers."""
    import importlib.util

    from edge_sdk.cli.device import materialize_main

    out = tmp_path / "files"
    assert materialize_main([str(precision_bundle), "--out", str(out)]) == 0
    store = edge_sdk.load(precision_bundle, profile=None)
    files = edge_sdk.load(out, profile=None)
    spec = importlib.util.spec_from_file_location(
        "predict_with_litert", Path(__file__).resolve().parents[2] / "docs" /
        "predict_with_litert.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for c in store.manifest.configurations:
        if c.id in files.left_out:
            continue
        a = store.predict(xs[0], config_id=c.id)
        b = files.predict(xs[0], config_id=c.id)
        assert a.probs == pytest.approx(b.probs, abs=1e-6) and a.label == b.label, c.id
        if "tflite-runtime" != files.backend:  # the example runs LiteRT
            got = example.predict(out, xs[0], c.id)
            assert got["label"] == b.label and got["probs"] == pytest.approx(b.probs, abs=1e-5)
