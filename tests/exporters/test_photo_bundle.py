"""A photo folder end to end: trained, exported with its evaluation transform recorded, and the
runtime's answer on a JPEG equal to the exporter's evaluation of the same photo."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.answers import metrics as M
from edge_sdk.bundle import SCHEMA_VERSION, read_manifest
from edge_sdk.inputs.images import open_image, prepare
from edge_sdk.store.sources import open_slices
from exporters.configs import slice_logits
from exporters.export import ExportOptions, export_bundle
from trainer.config import load_config
from trainer.data import load_data, nhwc_inputs
from trainer.folders import find_images
from trainer.train import train

from support import write_photos

QUIET = dict(progress=False, log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def photo_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    write_photos(root / "train", n=12)
    write_photos(root / "val", n=3, seed=1)
    write_photos(root / "test", n=4, seed=2)
    cfg = load_config("digits", [f"data.source=imagefolder:{root}", "data.image_size=16",
                                 "train.epochs=1", "train.batch_size=8", "data.calib_samples=16"])
    run = train(cfg, root / "run", **QUIET)
    bundle = root / "bundle"
    export_bundle(run.checkpoint, bundle, ExportOptions(widths=(0.5, 1.0), measure=False,
                                                        precisions=("float", "int8")), **QUIET)
    return cfg, root, bundle


def test_the_bundle_records_the_transform_and_answers_as_evaluated(photo_bundle):
    cfg, root, bundle = photo_bundle
    manifest = read_manifest(bundle)
    assert manifest.schema_version == SCHEMA_VERSION >= 9
    pre = manifest.input.preprocess
    data = load_data(cfg.data)
    assert pre == data.spec.preprocess and pre.crop == (16, 16)
    paths = [p.decode() for p in find_images(root / "test", manifest.labels)[0]]
    for i, p in enumerate(paths):  # the device's input is the exporter's, bit for bit
        assert np.array_equal(prepare(p, pre), data.test.raw[i])
    x, _ = nhwc_inputs(data.test)
    slices = open_slices(bundle, manifest)
    model = edge_sdk.load(bundle)
    points = [c for c in manifest.configurations if c.scope == "point"]
    assert {c.weights for c in points} >= {"int8"}
    for c in points:
        logits = slice_logits([slices[f.name] for f in c.files], c.scope, x)
        evaluated = M.sample_probs(logits, c.temperature).mean(0)
        for i, p in enumerate(paths):
            from_file = model.predict(p, config_id=c.id)
            full_size = model.predict(np.asarray(open_image(p)), config_id=c.id)
            np.testing.assert_allclose(from_file.probs, evaluated[i], atol=1e-5)
            np.testing.assert_allclose(full_size.probs, evaluated[i], atol=1e-5)
        batch = model.predict_batch(paths, config_id=c.id)
        np.testing.assert_allclose(batch.probs, evaluated, atol=1e-5)


def test_edge_sdk_run_takes_a_jpeg(photo_bundle):
    _, root, bundle = photo_bundle
    photo = sorted((root / "test" / "dog").glob("*.jpg"))[0]
    exe = Path(sys.executable).with_name("edge-sdk")
    out = subprocess.run([str(exe), "run", str(bundle), "--input", str(photo), "--json"],
                         check=True, capture_output=True, text=True).stdout
    answer = json.loads(out.strip().splitlines()[-1])
    direct = edge_sdk.load(bundle).predict(str(photo), config_id=answer["config_id"])
    assert answer["label"] == direct.label
    np.testing.assert_allclose(answer["probs"], direct.probs, atol=1e-6)
