"""Only verified bytes ever run (issue 19 §2): every slice is read once at load(), its sha256
checked on those bytes, its tensors checked against the manifest, and interpreters are built
from those bytes only. Hostile bundles are refused at load() with a typed error naming the file.

No torch here (only the ``bundle`` fixture needs it, or ``EDGE_SDK_TEST_BUNDLE``)."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.backends import BackendError
from edge_sdk.tflite.model_info import _Reader, read_io
from edge_sdk.bundle import (
    MANIFEST_NAME,
    Manifest,
    check_slice,
    file_entry,
    manifest_to_yaml,
    read_manifest,
    read_slices,
    verify_bytes,
)
from edge_sdk.errors import BundleError, EdgeSdkError, SliceError

DATA = Path(__file__).resolve().parent / "data"


def _configs(bundle: Path) -> dict[str, dict]:
    return {c["id"]: c for c in read_manifest(bundle).to_dict()["configurations"]}


def _copy(bundle: Path, dst: Path) -> Path:
    shutil.copytree(bundle, dst)
    return dst


def _rewrite(dst: Path, edit) -> Path:
    """``edit(manifest dict)`` then write the manifest back (valid YAML, valid schema)."""
    data = read_manifest(dst, verify=False).to_dict()
    edit(data)
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


def _put(dst: Path, config_id: str, blob: bytes) -> Path:
    """Replace ``config_id``'s first file by ``blob`` and list its sha256 in the manifest: a
    self-consistent bundle whose slice is not what the configuration says."""
    def edit(data: dict) -> None:
        (c,) = [c for c in data["configurations"] if c["id"] == config_id]
        (dst / c["files"][0]["name"]).write_bytes(blob)
        c["files"][0] = file_entry(c["files"][0]["name"], blob).to_dict()
    return _rewrite(dst, edit)


def _unknown_op(blob: bytes) -> bytes:
    """``blob`` with its first operator code set to builtin 250 (no such operator): still a
    well-formed flatbuffer with the same tensors, which only the interpreter refuses."""
    out = bytearray(blob)
    r = _Reader(bytes(blob), "model")
    oc = r.tables(r.ref(r.root(), 1))[0]
    builtin, deprecated = r._field(oc, 3), r._field(oc, 0)
    assert builtin and deprecated
    out[builtin:builtin + 4] = (250).to_bytes(4, "little")
    out[deprecated] = 127  # PLACEHOLDER_FOR_GREATER_OP_CODES: the real code is builtin_code
    return bytes(out)


def _by_scope(bundle: Path, scope: str, widest: bool = True) -> dict:
    cs = [c for c in _configs(bundle).values() if c["scope"] == scope]
    return max(cs, key=lambda c: c["width"]) if widest else min(cs, key=lambda c: c["width"])


def _file(bundle: Path, c: dict, i: int = 0) -> bytes:
    return (bundle / c["files"][i]["name"]).read_bytes()


# Each case builds a hostile bundle from a valid one and names what the refusal must mention.
def _h_head_file_as_point(b, d):  # the audit's "20 outputs read as 2 samples" class of bug
    return _put(d, _by_scope(b, "point")["id"], _file(b, _by_scope(b, "head"))), "output tensor"


def _h_point_file_as_head(b, d):
    return _put(d, _by_scope(b, "head")["id"], _file(b, _by_scope(b, "point"))), "output tensor"


def _h_foreign_model(b, d):  # a valid TFLite model for another input: [3, 16]
    blob = (DATA / "hybrid_fc_v12.tflite").read_bytes()
    return _put(d, _by_scope(b, "point")["id"], blob), "input tensor is float32 [3, 16]"


def _h_garbage(b, d):
    blob = bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8))
    return _put(d, _by_scope(b, "point")["id"], blob), "not a TFLite model"


def _h_truncated_flatbuffer(b, d):
    blob = _file(b, _by_scope(b, "point"))
    return _put(d, _by_scope(b, "point")["id"], blob[: len(blob) // 3]), "point"


def _h_truncated_buffers(b, d):
    """A few bytes short: what an interpreter that trusts the file reads past the end of
    (tflite-runtime 2.14 segfaulted on a truncated file before the reader checked bounds)."""
    blob = _file(b, _by_scope(b, "point"))
    return _put(d, _by_scope(b, "point")["id"], blob[: len(blob) - 64]), "not a valid TFLite"


def _h_wrong_identifier(b, d):
    blob = bytearray(_file(b, _by_scope(b, "point")))
    blob[4:8] = b"XXXX"
    return _put(d, _by_scope(b, "point")["id"], bytes(blob)), "file identifier"


def _h_unknown_operator(b, d):
    blob = _unknown_op(_file(b, _by_scope(b, "point")))
    return _put(d, _by_scope(b, "point")["id"], blob), "point"


def _h_swapped_on_disk(b, d):  # not listed in the manifest: the sha256 catches it
    c = _by_scope(b, "point")
    (d / c["files"][0]["name"]).write_bytes(_file(b, _by_scope(b, "head")))
    return d, "bytes, the manifest says"


def _h_same_size_other_bytes(b, d):
    c = _by_scope(b, "all")
    (d / c["files"][0]["name"]).write_bytes(_file(b, c, 1))  # sample 1's bytes, same size
    return d, "checksum mismatch"


def _h_grown(b, d):
    c = _by_scope(b, "point")
    with open(d / c["files"][0]["name"], "ab") as f:
        f.write(b"\0")
    return d, "bytes, the manifest says"


def _h_symlink_outside(b, d):
    c = _by_scope(b, "point")
    outside = d.parent / "outside.tflite"
    outside.write_bytes(_file(b, c))
    (d / c["files"][0]["name"]).unlink()
    (d / c["files"][0]["name"]).symlink_to(outside)
    return d, "outside the bundle"


def _h_missing_file(b, d):
    (d / _by_scope(b, "head")["files"][0]["name"]).unlink()
    return d, "missing"


HOSTILE = {name[3:]: f for name, f in dict(globals()).items() if name.startswith("_h_")}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_bundle_is_refused_at_load_naming_the_file(bundle, tmp_path, case):
    hostile, says = HOSTILE[case](bundle, _copy(bundle, tmp_path / "b"))
    with pytest.raises(EdgeSdkError) as info:
        edge_sdk.load(hostile, profile=None)
    msg = str(info.value)
    assert isinstance(info.value, (BundleError, BackendError)), type(info.value)
    assert ".tflite" in msg and says in msg, msg
    assert "\n" not in msg


def test_an_unknown_operator_is_refused_at_load_not_at_the_first_predict(bundle, tmp_path):
    c = _by_scope(bundle, "point")
    hostile = _put(_copy(bundle, tmp_path / "b"), c["id"], _unknown_op(_file(bundle, c)))
    # (issue 36) the graph reader refuses it before any interpreter sees it, naming the file
    with pytest.raises(SliceError, match=rf"{c['files'][0]['name']}: operator code 250 is not "
                                         "one edge-sdk writes"):
        read_slices(hostile, read_manifest(hostile))
    with pytest.raises(SliceError, match=rf"{c['files'][0]['name']}: operator code 250"):
        edge_sdk.load(hostile, profile=None)


def _x(bundle: Path) -> np.ndarray:
    spec = read_manifest(bundle).input
    lo, hi = spec.value_range
    return np.random.default_rng(1).uniform(lo, hi, spec.shape[1:]).astype(np.float32)


def test_a_file_swapped_after_load_never_runs(bundle, tmp_path):
    """Every configuration answers the same before and after every file on disk is replaced
    by another configuration's bytes, in this thread (cached interpreters dropped) and in a
    fresh thread (new interpreters): they are built from the bytes verified at load()."""
    copy = _copy(bundle, tmp_path / "b")
    model = edge_sdk.load(copy, profile=None)
    x = _x(bundle)
    ids = list(_configs(bundle))
    before = {i: tuple(model.predict(x, config_id=i).probs) for i in ids}
    names = sorted(p.name for p in copy.glob("*.tflite"))
    blobs = [(copy / n).read_bytes() for n in names]
    for n, blob in zip(names, blobs[1:] + blobs[:1]):  # every file gets another one's bytes
        (copy / n).write_bytes(blob)
    assert any((copy / n).read_bytes() != b for n, b in zip(names, blobs))
    model._forget_interpreters()  # this thread's interpreters are rebuilt too
    after: dict = {}
    t = threading.Thread(target=lambda: after.update(
        {i: tuple(model.predict(x, config_id=i).probs) for i in ids}))
    t.start()
    t.join(60)
    assert after == before
    assert {i: tuple(model.predict(x, config_id=i).probs) for i in ids} == before
    with pytest.raises(BundleError):  # while a fresh load() sees the swap
        edge_sdk.load(copy, profile=None)


def test_verification_is_a_function_of_bytes(bundle):
    """What a future in-memory materialiser calls: sha256 and tensors, on bytes alone."""
    m = read_manifest(bundle)
    point = next(c for c in m.configurations if c.scope == "point")
    head = next(c for c in m.configurations if c.scope == "head")
    blob = (bundle / point.files[0].name).read_bytes()
    verify_bytes(blob, point.files[0])
    check_slice(blob, point.files[0].name, point, m.input)
    with pytest.raises(BundleError, match="checksum mismatch"):
        verify_bytes(blob[:-1] + bytes([blob[-1] ^ 1]), point.files[0])
    with pytest.raises(BundleError, match=r"output tensor is float32 \[1, 10\].*needs float32 "
                                          rf"\[{head.samples}, 10\]"):
        check_slice(blob, point.files[0].name, head, m.input)
    assert read_slices(bundle, m)[point.files[0].name] == blob


def test_the_reader_sees_the_tensors_the_interpreter_sees(bundle):
    from edge_sdk.backends import interpreter_class

    Interpreter, _ = interpreter_class()  # the chosen backend (tflite-runtime in its CI step)

    for f in sorted(bundle.glob("*.tflite")):
        blob = f.read_bytes()
        (x,), outs = read_io(blob, f.name)
        y = outs[0]
        it = Interpreter(model_content=blob, num_threads=1)
        assert list(x.shape) == list(it.get_input_details()[0]["shape"])
        # every output, in order: the logits, then (issue 33) the features
        assert [list(o.shape) for o in outs] == \
            [list(d["shape"]) for d in it.get_output_details()]
        assert [o.index for o in outs] == [d["index"] for d in it.get_output_details()]
        assert x.index == it.get_input_details()[0]["index"]
