"""Batch-resizable slices (issue 19 §4, the bundle side): a schema-2 bundle records its batch
dimension and every slice, resized to N with real LiteRT, answers what N single invokes answer;
a version-1 manifest still loads, as batch 1 only; load() refuses a slice whose shape
signature frees any other dimension. No torch (only the ``bundle`` fixture needs it)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.tflite.model_info import _Reader
from edge_sdk.bundle import MANIFEST_NAME, Manifest, file_entry, manifest_to_yaml, read_manifest
from edge_sdk.errors import BundleError
from runtime_support import without_cascade_targets, without_val_accuracy

Interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter


def _invoke(blob: bytes, x: np.ndarray) -> np.ndarray:
    it = Interpreter(model_content=blob, num_threads=1)
    idx = it.get_input_details()[0]["index"]
    if x.shape[0] != 1:
        it.resize_tensor_input(idx, list(x.shape))
    it.allocate_tensors()
    it.set_tensor(idx, x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_the_exporter_records_the_batch_dimension(bundle):
    m = read_manifest(bundle)
    assert m.schema_version >= 2 and m.batch_dim == 0 and m.batch_resizable


@pytest.mark.parametrize("n", [1, 3, 8])
def test_every_slice_resized_to_n_equals_n_single_invokes(bundle, n):
    m = read_manifest(bundle)
    rng = np.random.default_rng(n)
    lo, hi = m.input.value_range
    raw = rng.uniform(lo, hi, (n, *m.input.shape[1:])).astype(np.float32)
    xs = ((raw - np.float32(m.input.mean)) / np.float32(m.input.std)).astype(np.float32)
    for c in m.configurations:
        for f in c.files:
            blob = (bundle / f.name).read_bytes()
            singles = np.concatenate([_invoke(blob, x[None]) for x in xs])
            batched = _invoke(blob, xs)
            rows = c.output.shape[0]
            assert batched.shape == (n * rows, c.output.shape[1])  # [N * rows, C]
            assert np.abs(batched - singles).max() <= 1e-5, (c.id, f.name)


def _as_version_1(bundle: Path, dst: Path) -> Path:
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    data["schema_version"] = 1
    without_cascade_targets(data)  # schema version 8's
    without_val_accuracy(data)  # schema version 10's
    del data["batch_dim"]
    data.pop("uncertainty", None)  # schema version 5's; the file stays, unlisted
    data.pop("input_stats", None)  # schema version 6's
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


def test_a_version_1_bundle_loads_as_batch_1(bundle, tmp_path):
    v1 = _as_version_1(bundle, tmp_path / "v1")
    assert (v1 / MANIFEST_NAME).read_text().startswith("# edge-sdk bundle manifest (schema "
                                                       "version 1)\nschema_version: 1\n")
    model = edge_sdk.load(v1, profile=None)
    assert model.manifest.schema_version == 1 and not model.manifest.batch_resizable
    x = np.zeros(model.manifest.input.shape[1:], np.float32)
    assert model.predict(x).label in range(len(model.manifest.labels))


def test_a_shape_signature_freeing_another_dimension_is_refused(bundle, tmp_path):
    """-1 in H of a slice's input: it would accept another image size. Refused at load()."""
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    c = next(c for c in data["configurations"] if c["scope"] == "point")
    blob = bytearray((dst / c["files"][0]["name"]).read_bytes())
    r = _Reader(bytes(blob), "model")
    sg = r.tables(r.ref(r.root(), 2))[0]
    (inp,) = r.ints(r.ref(sg, 1))
    sig = r.ref(r.tables(r.ref(sg, 0))[inp], 7)
    assert r.ints(sig)[:2] == [-1, data["input"]["shape"][1]]
    blob[sig + 8:sig + 12] = (-1).to_bytes(4, "little", signed=True)  # dimension 1 (H)
    (dst / c["files"][0]["name"]).write_bytes(bytes(blob))
    c["files"][0] = file_entry(c["files"][0]["name"], bytes(blob)).to_dict()
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    # (issue 36) the graph reader refuses it first, naming the tensor
    with pytest.raises(BundleError, match=r"tensor 'input': shape signature \[-1, -1, .*-1 in "
                                          r"dimension 0 alone"):
        edge_sdk.load(dst, profile=None)
