"""docs/predict_with_litert.py (the worked example of docs/manifest.md) reproduces
``EdgeModel.predict`` from the manifest with plain LiteRT: every configuration of a real
bundle, several samples, each field of the answer. No torch."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.bundle import read_manifest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "predict_with_litert.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("predict_with_litert", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def xs(bundle) -> np.ndarray:
    """Raw samples across the value range, including both ends."""
    spec = read_manifest(bundle).input
    lo, hi = spec.value_range
    rng = np.random.default_rng(7)
    out = rng.uniform(lo, hi, (4, *spec.shape[1:])).astype(np.float32)
    out[0].flat[0], out[0].flat[-1] = lo, hi
    return out


def _same(got: dict, want, atol: float = 1e-5) -> None:
    assert got["config_id"] == want.config_id
    assert got["label"] == want.label and got["class_name"] == want.class_name
    assert got["probs"] == pytest.approx(want.probs, abs=atol)
    assert got["confidence"] == pytest.approx(want.confidence, abs=atol)
    assert got["entropy"] == pytest.approx(want.entropy, abs=atol)
    assert got["mutual_info"] == pytest.approx(want.mutual_info, abs=atol)
    assert got["abstain"] == want.abstain
    if want.ood_score is None:  # issue 33's fields
        assert got["ood_score"] is None
    else:
        assert got["ood_score"] == pytest.approx(want.ood_score, abs=atol)
        assert got["in_distribution"] == want.in_distribution
    assert got["prediction_set"] == (None if want.prediction_set is None
                                     else list(want.prediction_set))
    assert (got["width"], got["scope"], got["samples"]) == (want.width, want.scope, want.samples)


def test_every_configuration_answers_as_predict_does(bundle, example, xs):
    model = edge_sdk.load(bundle, profile=None)
    for c in model.manifest.configurations:
        for x in xs:
            _same(example.predict(bundle, x, c.id), model.predict(x, config_id=c.id))


@pytest.mark.parametrize("target", [0.9, 0.99])
def test_the_threshold_of_another_target_accuracy(bundle, example, xs, target):
    model = edge_sdk.load(bundle, profile=None, target_accuracy=target)
    for c in model.manifest.configurations:
        got = example.predict(bundle, xs[1], c.id, target=f"{target:g}")
        _same(got, model.predict(xs[1], config_id=c.id))


def test_without_a_configuration_it_takes_predicts_unconstrained_choice(bundle, example, xs):
    model = edge_sdk.load(bundle, profile=None)
    want = model.predict(xs[2])  # no budget: the rule's choice
    _same(example.predict(bundle, xs[2]), want)


def test_a_grey_sample_without_the_channel_axis(bundle, example, xs):
    if xs.shape[-1] != 1:
        pytest.skip("an RGB bundle")
    model = edge_sdk.load(bundle, profile=None)
    c = model.manifest.configurations[-1].id
    _same(example.predict(bundle, xs[3][..., 0], c), model.predict(xs[3], config_id=c))


def test_it_runs_as_a_script(bundle, xs, tmp_path):
    np.save(tmp_path / "x.npy", xs[0])
    r = subprocess.run([sys.executable, str(SCRIPT), str(bundle), str(tmp_path / "x.npy")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = edge_sdk.load(bundle, profile=None).predict(xs[0])
    assert out["config_id"] == want.config_id and out["label"] == want.label


def test_it_refuses_what_predict_refuses(bundle, example, xs):
    spec = read_manifest(bundle).input
    with pytest.raises(ValueError, match="raw range"):
        example.predict(bundle, xs[0] + spec.value_range[1] + 1)
    with pytest.raises(ValueError, match="shape"):
        example.predict(bundle, xs[0][:-1])
