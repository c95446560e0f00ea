"""`edge-sdk run --input` with an image (Pillow, the [image] extra) and without Pillow.
Real bundle, no torch."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import edge_sdk
from edge_sdk.cli import device as commands
from edge_sdk.bundle import read_manifest
from edge_sdk.cli.device import run_main
from edge_sdk.errors import InputError

Image = pytest.importorskip("PIL.Image")  # a dev-extra dependency
PLENTY_MB = 1e6


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """run_main loads with profile="auto": never read the user's profile cache."""
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def manifest(bundle):
    return read_manifest(bundle)


def grey_png(path, pixels: np.ndarray):
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def pixels(manifest, seed: int = 0, size=None) -> np.ndarray:
    _, h, w, _ = manifest.input.shape
    h, w = size or (h, w)
    px = np.random.default_rng(seed).integers(0, 256, (h, w), dtype=np.uint8)
    px[0, 0], px[-1, -1] = 0, 255  # both ends of the range present
    return px


def run_json(argv, capsys) -> list[dict]:
    assert run_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return [json.loads(line) for line in lines]


def test_an_image_of_the_input_size_matches_predicting_the_array(bundle, manifest, tmp_path,
                                                                 capsys):
    assert manifest.input.shape[-1] == 1, "this test writes a grey PNG"
    px = pixels(manifest)
    png = grey_png(tmp_path / "digit.png", px)
    (out,) = run_json([str(bundle), "--input", str(png), "--json"], capsys)
    assert out["class_name"] in manifest.labels
    assert manifest.labels[out["label"]] == out["class_name"]
    # float32: the answer's softmax runs in the interpreter (edge_sdk.answers.graph)
    assert sum(out["probs"]) == pytest.approx(1.0, abs=1e-6)

    lo, hi = manifest.input.value_range
    x = (px.astype(np.float64) / 255.0 * (hi - lo) + lo).reshape(manifest.input.shape[1:])
    m = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    direct = m.predict(x.astype(np.float32))
    assert out["config_id"] == direct.config_id
    assert out["label"] == direct.label
    np.testing.assert_allclose(out["probs"], direct.probs, atol=1e-5)


def test_image_pixels_map_onto_the_raw_value_range(manifest, tmp_path):
    px = pixels(manifest, seed=1)
    x = commands._read_input(str(grey_png(tmp_path / "d.png", px)), manifest.input)
    lo, hi = manifest.input.value_range
    assert x.shape == tuple(manifest.input.shape[1:])
    np.testing.assert_allclose(x[..., 0], px / 255.0 * (hi - lo) + lo, rtol=1e-6, atol=1e-6)
    assert x.min() == pytest.approx(lo) and x.max() == pytest.approx(hi)


@pytest.mark.parametrize("size", [(16, 16), (5, 11), (64, 40)])
def test_an_image_of_another_size_is_resized_only_with_resize(bundle, manifest, tmp_path,
                                                              capsys, size):
    png = grey_png(tmp_path / "big.png", pixels(manifest, seed=2, size=size))
    x = commands._read_input(str(png), manifest.input, resize=True)
    assert x.shape == tuple(manifest.input.shape[1:])
    (out,) = run_json([str(bundle), "--input", str(png), "--json", "--resize"], capsys)
    assert out["class_name"] in manifest.labels
    with pytest.raises(InputError, match="--resize"):
        run_main([str(bundle), "--input", str(png)])


def test_a_colour_image_is_converted_for_a_grey_model_only_with_resize(bundle, manifest,
                                                                       tmp_path, capsys):
    _, h, w, _ = manifest.input.shape
    rgb = np.random.default_rng(3).integers(0, 256, (h, w, 3), dtype=np.uint8)
    png = tmp_path / "colour.png"
    Image.fromarray(rgb).save(png)
    (out,) = run_json([str(bundle), "--input", str(png), "--json", "--resize"], capsys)
    assert out["class_name"] in manifest.labels
    with pytest.raises(InputError, match="3 channel"):
        run_main([str(bundle), "--input", str(png)])


def test_plain_output_names_the_class(bundle, manifest, tmp_path, capsys):
    png = grey_png(tmp_path / "d.png", pixels(manifest))
    assert run_main([str(bundle), "--input", str(png)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.split("\t")[0] in manifest.labels


def test_without_pillow_an_image_is_an_input_error_naming_the_extra(bundle, manifest, tmp_path,
                                                                      monkeypatch, capsys):
    png = grey_png(tmp_path / "d.png", pixels(manifest))
    monkeypatch.setitem(sys.modules, "PIL", None)  # `from PIL import Image` -> ImportError
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(InputError, match=r"edge-sdk\[image\]"):
        run_main([str(bundle), "--input", str(png), "--json"])
    # a .npy input still works without Pillow
    lo, hi = manifest.input.value_range
    npy = tmp_path / "x.npy"
    np.save(npy, np.full(manifest.input.shape[1:], (lo + hi) / 2, np.float32))
    (out,) = run_json([str(bundle), "--input", str(npy), "--json"], capsys)
    assert out["class_name"] in manifest.labels


@pytest.mark.parametrize("name", ["absent.png", "absent.npy", "no_suffix"])
def test_a_missing_input_file_is_an_input_error(bundle, tmp_path, name):
    with pytest.raises(InputError, match="does not exist"):
        run_main([str(bundle), "--input", str(tmp_path / name)])


def test_a_directory_is_not_an_input_file(bundle, tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        run_main([str(bundle), "--input", str(tmp_path)])
