"""`edge-sdk run --input x.npy`: whether the array is one sample or a batch is decided from the
bundle's input spec, so a grey model's [N, H, W] is a batch and [H, W] one sample. Real bundle,
no torch."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import edge_sdk
from edge_sdk.bundle import read_manifest
from edge_sdk.cli.device import _is_batch, run_main
from edge_sdk.errors import InputError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """run_main loads with profile="auto": never read the user's profile cache."""
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def manifest(bundle):
    return read_manifest(bundle)


@pytest.fixture(scope="module")
def grey(manifest) -> np.ndarray:
    """Three grey samples [3, H, W] in the raw value range."""
    _, h, w, c = manifest.input.shape
    assert c == 1, "the test bundle is a grey (digits) model"
    lo, hi = manifest.input.value_range
    return np.random.default_rng(0).uniform(lo, hi, (3, h, w)).astype(np.float32)


def run_json(bundle, array, tmp_path, capsys) -> list[dict]:
    path = tmp_path / "x.npy"
    np.save(path, array)
    assert run_main([str(bundle), "--input", str(path), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


@pytest.mark.parametrize("form", ["[N, H, W]", "[N, H, W, 1]"])
def test_a_grey_batch_with_or_without_the_channel_axis_is_n_predictions(
        bundle, grey, form, tmp_path, capsys):
    xs = grey if form == "[N, H, W]" else grey[..., None]
    outs = run_json(bundle, xs, tmp_path, capsys)
    assert len(outs) == len(grey)
    model = edge_sdk.load(bundle, profile=None)
    for x, out in zip(grey, outs):  # each line is that sample's answer
        want = model.predict(x, config_id=out["config_id"])
        assert out["label"] == want.label
        assert out["probs"] == pytest.approx(want.probs, abs=1e-6)


@pytest.mark.parametrize("form", ["[H, W]", "[H, W, 1]"])
def test_one_grey_sample_with_or_without_the_channel_axis_is_one_prediction(
        bundle, grey, form, tmp_path, capsys):
    x = grey[0] if form == "[H, W]" else grey[0][..., None]
    (out,) = run_json(bundle, x, tmp_path, capsys)
    want = edge_sdk.load(bundle, profile=None).predict(grey[0], config_id=out["config_id"])
    assert out["probs"] == pytest.approx(want.probs, abs=1e-6)


def test_a_wrong_shape_is_one_sample_whose_error_names_the_accepted_forms(
        bundle, manifest, grey, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, grey[:, :-1, :])  # [N, H-1, W]: neither a batch nor a sample
    with pytest.raises(InputError, match=r"for a grey image"):
        run_main([str(bundle), "--input", str(path)])


@pytest.mark.parametrize("shape, batch", [
    ((8, 8), False), ((8, 8, 1), False), ((5, 8, 8), True), ((5, 8, 8, 1), True),
    ((1, 8, 8), True), ((8, 8, 2), False)])
def test_is_batch_for_a_grey_spec(shape, batch):
    spec = SimpleNamespace(shape=(1, 8, 8, 1))
    assert _is_batch(np.zeros(shape), spec) is batch


@pytest.mark.parametrize("shape, batch", [
    ((8, 8, 3), False), ((5, 8, 8, 3), True), ((3, 8, 8), False)])
def test_is_batch_for_an_rgb_spec(shape, batch):
    """An RGB model has no channel-less form: a 3-D array is always one sample."""
    spec = SimpleNamespace(shape=(1, 8, 8, 3))
    assert _is_batch(np.zeros(shape), spec) is batch
