"""A bundle that records its photo transform (``input.preprocess``): ``predict`` and
``predict_batch`` take image files, Pillow images and uint8 photos of any size, each prepared
exactly as :func:`edge_sdk.inputs.images.prepare` prepares it, and ``edge-sdk run --input
photo.jpg`` answers as ``predict(path)``; the same bundle without a transform behaves as before.
The bundle is built here (a tiny RGB network written by edge_sdk.tflite): no torch."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk import bundle as b
from edge_sdk.cli.device import run_main
from edge_sdk.errors import InputError
from edge_sdk.inputs.images import prepare
from edge_sdk.tflite.build import GraphBuilder
from test_bundle import config_dict

Image = pytest.importorskip("PIL.Image")  # the [image] extra
PLENTY_MB = 1e6
H, W = 8, 8
PRE = b.Preprocess(resize=10, crop=(H, W))


def tiny_rgb_slice(seed: int = 0) -> bytes:
    """input [N, 8, 8, 3] -> 3x3 conv (6 channels, ReLU) -> mean over H, W -> 3 logits."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder()
    x = g.add_input("input", (1, H, W, 3))
    conv = g.conv2d(x, g.add_const(rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32), "cw"),
                    g.add_const(rng.normal(0, 0.1, 6).astype(np.float32), "cb"),
                    activation="relu", name="conv")
    pool = g.mean(conv, name="pool")
    fc = g.fully_connected(pool, g.add_const(rng.normal(0, 1, (3, 6)).astype(np.float32), "fw"),
                           g.add_const(np.zeros(3, np.float32), "fb"), name="fc")
    g.mark_output(fc, "logits")
    return g.finish(resizable_batch=True)


def write_photo_bundle(path: Path, preprocess: b.Preprocess | None) -> Path:
    data = tiny_rgb_slice()
    cfg = config_dict("w1.00-point", "point", 1, ["w100_point.tflite"], width=1.0)
    cfg["files"] = [b.file_entry("w100_point.tflite", data).to_dict()]
    spec = {"shape": [1, H, W, 3], "dtype": "uint8", "value_range": [0.0, 255.0],
            "mean": [120.0, 115.0, 100.0], "std": [60.0, 58.0, 62.0]}
    if preprocess is not None:
        spec["preprocess"] = preprocess.to_dict()
    m = b.Manifest.from_dict({"schema_version": b.SCHEMA_VERSION, "input": spec,
                              "labels": ["cat", "dog", "bird"], "batch_dim": 0,
                              "configurations": [cfg]})
    return b.write_bundle(path, m, {"w100_point.tflite": data})


@pytest.fixture(scope="module")
def photo_bundle(tmp_path_factory) -> Path:
    return write_photo_bundle(tmp_path_factory.mktemp("photo") / "bundle", PRE)


@pytest.fixture(scope="module")
def plain_bundle(tmp_path_factory) -> Path:
    return write_photo_bundle(tmp_path_factory.mktemp("plain") / "bundle", None)


@pytest.fixture(scope="module")
def model(photo_bundle):
    return edge_sdk.load(photo_bundle, profile=None, memory_reader=lambda: PLENTY_MB)


def photo(h: int, w: int, colour: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """A uint8 photo: a colour, a diagonal gradient and noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.asarray(colour, float) + 60 * ((yy + xx) / (h + w))[..., None] \
        + rng.normal(0, 25, (h, w, 3))
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("photos")
    out = {"red.jpg": photo(61, 43, (190, 40, 30), 1), "blue.png": photo(30, 52, (20, 60, 180), 2),
           "green.jpg": photo(40, 40, (40, 170, 60), 3)}
    for name, a in out.items():
        Image.fromarray(a).save(d / name)
    return {name: d / name for name in out}


def test_a_file_an_array_and_a_pillow_image_answer_as_their_prepared_input(model, photos):
    answers = {}
    for name, path in photos.items():
        ref = model.predict(prepare(path, PRE))  # the model's input, as the exporter made it
        assert ref.probs.shape == (3,)
        np.testing.assert_array_equal(model.predict(path).probs, ref.probs)
        np.testing.assert_array_equal(model.predict(str(path)).probs, ref.probs)
        with Image.open(path) as img:
            np.testing.assert_array_equal(model.predict(img).probs, ref.probs)
        with Image.open(path) as img:
            decoded = np.asarray(img.convert("RGB"))
        assert decoded.shape[:2] != (H, W)
        np.testing.assert_array_equal(model.predict(decoded).probs, ref.probs)
        answers[name] = ref.probs
    # the photos differ, and so do their answers: the comparisons above can fail
    assert not np.allclose(answers["red.jpg"], answers["blue.png"], atol=1e-4)


def test_a_big_uint8_array_is_resized_and_cropped_not_refused(model):
    big = photo(480, 640, (150, 120, 90), 7)
    prepared = prepare(big, PRE)
    assert prepared.shape == (H, W, 3)
    np.testing.assert_array_equal(model.predict(big).probs, model.predict(prepared).probs)
    grey = big[..., 0]  # a grey photo: Pillow's L -> RGB
    np.testing.assert_array_equal(model.predict(grey).probs,
                                  model.predict(prepare(grey, PRE)).probs)


def test_an_array_of_the_input_shape_is_the_input_as_it_is(model):
    """The rule: an array of the model's exact shape is its input (no resize), anything else a
    photo. An 8 x 8 photo through the transform (shorter side 10, centre 8) differs."""
    x = photo(H, W, (100, 100, 100), 4)
    as_photo = prepare(Image.fromarray(x), PRE)
    assert not np.array_equal(as_photo, x)
    direct = model.predict(x)
    np.testing.assert_array_equal(direct.probs, model.predict_batch(x[None]).probs[0])
    assert not np.allclose(direct.probs, model.predict(as_photo).probs, atol=1e-6)


def test_predict_batch_takes_a_sequence_of_photos(model, photos):
    big = photo(100, 70, (60, 60, 200), 5)
    exact = photo(H, W, (10, 200, 10), 6)
    with Image.open(photos["blue.png"]) as img:
        img.load()
    items = [photos["red.jpg"], big, exact, img]
    bp = model.predict_batch(items)
    assert bp.probs.shape == (4, 3)
    one = np.stack([model.predict(x).probs for x in items])
    np.testing.assert_allclose(bp.probs, one, atol=1e-6)
    stacked = np.stack([prepare(photos["red.jpg"], PRE), prepare(big, PRE), exact,
                        prepare(photos["blue.png"], PRE)])
    np.testing.assert_array_equal(model.predict_batch(stacked).probs, bp.probs)
    # [N, h, w, 3] uint8 photos of another size: N photos
    two = np.stack([big, photo(100, 70, (200, 60, 60), 8)])
    np.testing.assert_array_equal(model.predict_batch(two).probs,
                                  model.predict_batch(list(two)).probs)
    np.testing.assert_array_equal(model.predict_batch([photos["green.jpg"]]).probs[0],
                                  model.predict(photos["green.jpg"]).probs)


def test_what_is_not_a_photo_is_an_input_error_naming_it(model, photos, tmp_path):
    bad = tmp_path / "notes.jpg"
    bad.write_text("not a picture")
    with pytest.raises(InputError, match=r"notes\.jpg is not a readable image"):
        model.predict(bad)
    with pytest.raises(InputError, match=r"missing\.jpg is not a readable image"):
        model.predict(str(tmp_path / "missing.jpg"))
    scaled = photo(30, 40, (100, 100, 100)).astype(np.float32) / 255
    with pytest.raises(InputError, match=r"x is a float32 array of shape \[30, 40, 3\]: neither "
                                         r"the model's input \[8, 8, 3\] nor a photo.*uint8"):
        model.predict(scaled)
    with pytest.raises(InputError, match=r"xs\[1\] is a float32 array of shape \[30, 40, 3\]"):
        model.predict_batch([photos["red.jpg"], scaled])
    with pytest.raises(InputError, match=r"xs\[0\] is a float64 array of shape \[2, 30, 40\]"):
        model.predict_batch(np.zeros((2, 2, 30, 40)))
    # the exact shape in the wrong dtype: the input's own check, as for any uint8 bundle
    with pytest.raises(InputError, match="declares uint8 input"):
        model.predict(np.zeros((H, W, 3), np.float32))
    with pytest.raises(InputError, match="use predict_batch"):
        model.predict(np.zeros((2, H, W, 3), np.uint8))
    with pytest.raises(InputError, match=r"x has shape \[1, 30, 40, 3\]: expected one sample"):
        model.predict(np.zeros((1, 30, 40, 3), np.uint8))
    with pytest.raises(InputError, match=r"xs is one photo .*takes a sequence"):
        model.predict_batch(photos["red.jpg"])
    with pytest.raises(InputError, match="N >= 1"):
        model.predict_batch([])


def test_without_a_transform_nothing_changes(plain_bundle, model, photos):
    m = edge_sdk.load(plain_bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    assert m.manifest.input.preprocess is None
    assert type(m._inputs).__name__ == "InputChecker"  # the photo checks never run
    with pytest.raises(InputError, match=r"must have shape \[8, 8, 3\].*got \[61, 43, 3\]"):
        m.predict(photo(61, 43, (190, 40, 30)))
    with pytest.raises(InputError, match="not an array"):
        m.predict(str(photos["red.jpg"]))
    with pytest.raises(InputError, match=r"xs must have shape \[N, 8, 8, 3\]"):
        m.predict_batch(np.zeros((2, 30, 40, 3), np.uint8))
    x = photo(H, W, (100, 100, 100), 4)  # the same network: the input's shape answers alike
    np.testing.assert_array_equal(m.predict(x).probs, model.predict(x).probs)


# --------------------------------------------------------------------------- edge-sdk run
def run_json(argv: list[str], capsys) -> list[dict]:
    assert run_main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


def test_run_with_a_photo_answers_as_predict_on_its_path(photo_bundle, model, photos, capsys):
    for name, path in photos.items():
        direct = model.predict(path)
        (out,) = run_json([str(photo_bundle), "--input", str(path), "--json"], capsys)
        assert out["class_name"] == direct.class_name, name
        np.testing.assert_allclose(out["probs"], direct.probs, atol=1e-6)
        # --resize is for bundles without a transform: accepted, and changes nothing here
        (again,) = run_json([str(photo_bundle), "--input", str(path), "--resize", "--json"],
                            capsys)
        assert again["probs"] == out["probs"]
    assert run_main([str(photo_bundle), "--input", str(photos["red.jpg"])]) == 0
    line = capsys.readouterr().out
    assert line.split("\t")[0] == model.predict(photos["red.jpg"]).class_name


def test_run_with_a_uint8_npy_photo_prepares_it(photo_bundle, model, tmp_path, capsys):
    big = photo(50, 70, (90, 150, 200), 9)
    np.save(tmp_path / "one.npy", big)
    (out,) = run_json([str(photo_bundle), "--input", str(tmp_path / "one.npy"), "--json"],
                      capsys)
    np.testing.assert_allclose(out["probs"], model.predict(prepare(big, PRE)).probs, atol=1e-6)
    two = np.stack([big, photo(50, 70, (200, 90, 20), 10)])
    np.save(tmp_path / "two.npy", two)
    outs = run_json([str(photo_bundle), "--input", str(tmp_path / "two.npy"), "--json"], capsys)
    np.testing.assert_allclose([o["probs"] for o in outs], model.predict_batch(list(two)).probs,
                               atol=1e-6)


def test_run_refuses_an_unreadable_photo_in_one_line(photo_bundle, tmp_path, capsys):
    from edge_sdk.cli.main import main

    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + b"\0" * 20)
    assert main(["run", str(photo_bundle), "--input", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.jpg is not a readable image" in err and len(err.splitlines()) == 1
