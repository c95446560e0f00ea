"""Interpreter backends: the choice (argument, EDGE_SDK_BACKEND, auto), one-line errors when none
is usable, the .tflite operator reader, and refusing what a backend would answer wrongly.

Runs in both device environments: the main venv (LiteRT) and the CI's tflite-runtime venv (the
device wheel + tflite-runtime 2.14 + numpy<2, no LiteRT, no torch); each test uses the backends
that are there and skips the rest."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk import backends
from edge_sdk.backends import ENV_VAR, BackendError, check_bundle
from edge_sdk.tflite import model_info as tflite_model
from edge_sdk.bundle import (MANIFEST_NAME, Manifest, file_entry, manifest_to_yaml, read_manifest,
                             read_slices)
from edge_sdk.errors import BundleError, EdgeSdkError

DATA = Path(__file__).resolve().parent / "data"  # written by data/make_hybrid_fc.py


USABLE = backends.usable()


@pytest.fixture(autouse=True)
def _no_env_choice(monkeypatch):
    """The CI's tflite-runtime run sets EDGE_SDK_BACKEND; these tests set it themselves."""
    monkeypatch.delenv(ENV_VAR, raising=False)


# ------------------------------------------------------------------------------------ choice


def test_the_choice_comes_from_the_argument_then_the_environment_then_auto(monkeypatch):
    assert backends.resolve_name() == "auto"
    monkeypatch.setenv(ENV_VAR, "tflite-runtime")
    assert backends.resolve_name() == "tflite-runtime"
    assert backends.resolve_name("litert") == "litert"  # the argument wins
    monkeypatch.setenv(ENV_VAR, "  ")
    assert backends.resolve_name() == "auto"
    for alias, name in [("LiteRT", "litert"), ("ai-edge-litert", "litert"), ("ai_edge_litert", "litert"),
                        ("tflite_runtime", "tflite-runtime"), ("tflite", "tflite-runtime"), ("AUTO", "auto")]:
        assert backends.resolve_name(alias) == name


def test_an_unknown_backend_is_one_line_naming_the_source_and_the_choices(monkeypatch):
    with pytest.raises(BackendError, match=r"^backend must be auto, litert or tflite-runtime, got "
                                           r"'litrt' \(did you mean 'litert'\?\)$"):
        backends.resolve_name("litrt")
    monkeypatch.setenv(ENV_VAR, "onnx")
    with pytest.raises(BackendError, match=r"^EDGE_SDK_BACKEND must be auto, litert or "
                                           r"tflite-runtime, got 'onnx'$"):
        backends.interpreter_class()
    with pytest.raises(BackendError, match="must be a string"):
        backends.resolve_name(3)
    assert issubclass(BackendError, EdgeSdkError)  # the CLI reports it as one line, exit 2


def _fake_backends(monkeypatch, usable: set[str], others: str = "missing") -> None:
    """Stand-ins for the backends in ``usable``; the others are missing, or (``others="real"``)
    what this environment has."""
    real_import, real_installed = backends._import, backends._installed

    class Fake:
        def __init__(self, **kwargs):
            raise AssertionError("a fake interpreter must not be created")

    def fake_import(name):
        if name in usable:
            return Fake
        if others == "real":
            return real_import(name)
        raise BackendError(f"{name} is not installed: {backends.INSTALL[name]}")

    monkeypatch.setattr(backends, "_import", fake_import)
    monkeypatch.setattr(backends, "_installed", lambda name: name in usable or (
        others == "real" and real_installed(name)))


@pytest.mark.parametrize("usable, chosen", [({"litert", "tflite-runtime"}, "litert"),
                                            ({"tflite-runtime"}, "tflite-runtime"),
                                            ({"litert"}, "litert")])
def test_auto_takes_litert_first_then_tflite_runtime(monkeypatch, usable, chosen):
    _fake_backends(monkeypatch, usable)
    assert backends.interpreter_class()[1] == chosen
    assert backends.available() == [n for n in backends.BACKENDS if n in usable]
    for name in usable:
        assert backends.interpreter_class(name)[1] == name


def test_an_explicit_backend_that_is_missing_says_what_to_install(monkeypatch):
    _fake_backends(monkeypatch, {"litert"})
    with pytest.raises(BackendError, match=r"^tflite-runtime is not installed: pip install "
                                           r"tflite-runtime==2\.14\.0 'numpy<2'"):
        backends.interpreter_class("tflite-runtime")


def test_with_neither_backend_the_first_load_says_so_in_one_line(bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)  # find_spec -> None: not installed
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    with pytest.raises(BackendError) as info:
        edge_sdk.load(bundle, profile=None)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("no usable TFLite interpreter: litert is not installed; tflite-runtime "
                          "is not installed. Install one: pip install ai-edge-litert==2.3.0")
    assert "pip install tflite-runtime==2.14.0 'numpy<2'" in msg


def test_tflite_runtime_next_to_numpy_2_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(backends, "_installed", lambda name: True)
    monkeypatch.setattr(np, "__version__", "2.1.3")
    with pytest.raises(BackendError, match=r"^tflite-runtime needs numpy < 2 \(built against "
                                           r"NumPy 1\.x\), found numpy 2\.1\.3: pip install 'numpy<2'$"):
        backends.interpreter_class("tflite-runtime")


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_load_runs_on_the_chosen_backend(bundle, monkeypatch, name):
    """Also exports the session bundle when run alone (.ci/run tflite-runtime does)."""
    if name not in USABLE:
        pytest.skip(f"{name} is not usable here")
    model = edge_sdk.load(bundle, profile=None, backend=name)
    assert model.backend == name
    x = np.zeros(model.input_spec.shape[1:], np.float32)
    assert 0 < model.predict(x).confidence <= 1
    monkeypatch.setenv(ENV_VAR, name)
    assert edge_sdk.load(bundle, profile=None).backend == name


def test_auto_uses_the_first_usable_backend(bundle):
    if not USABLE:
        pytest.skip("no backend here")
    assert edge_sdk.load(bundle, profile=None).backend == USABLE[0]


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_the_runtime_s_interpreter_calls_the_compiled_wrapper_and_still_resizes(name):
    """(issue 34) set_tensor / invoke / get_tensor are the wrapper's own methods (no Python
    frame per call), which hold references to it: the backends' reference count check would
    then refuse every later resize or allocation, unless edge_sdk's class drops it."""
    if name not in USABLE:
        pytest.skip(f"{name} is not usable here")
    cls, _ = backends.interpreter_class(name)
    it = cls(model_content=backends._ONE_OP_MODEL, num_threads=1)  # y = x + x
    it.allocate_tensors()
    for m in ("set_tensor", "invoke", "get_tensor"):
        assert m in vars(it) and getattr(it, m).__self__ is it._interpreter
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    it.set_tensor(i, np.array([[1.5]], np.float32))
    it.invoke()
    assert it.get_tensor(o).tolist() == [[3.0]]
    it.resize_tensor_input(i, [4, 1])  # no "at least 1 reference to internal data" refusal
    it.allocate_tensors()
    it.set_tensor(i, np.arange(4, dtype=np.float32)[:, None])
    it.invoke()
    assert it.get_tensor(o).ravel().tolist() == [0.0, 2.0, 4.0, 6.0]
    del it  # the wrapper released before the backend's delegates: no crash


# --------------------------------------------------------------------------- operator reader


def test_the_reader_sees_the_hybrid_fully_connected_layer():
    for version in (12, 3):
        (op,) = tflite_model.read_ops_file(DATA / f"hybrid_fc_v{version}.tflite")
        assert (op.name, op.code, op.version) == ("FULLY_CONNECTED", 9, version)
        x, w, b = op.inputs
        assert (x.type, x.scales) == ("float32", 0)
        assert (w.type, w.scales) == ("int8", 8)  # per channel
        assert b.type == "float32"


def test_the_reader_agrees_with_litert_s_schema_on_every_file_of_the_bundle(bundle):
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated", exc_type=ImportError)
    types = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    files = sorted(bundle.glob("*.tflite")) + sorted(DATA.glob("*.tflite"))
    for path in files:
        m = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
        expected = []
        for sg in m.subgraphs:
            for op in sg.operators:
                oc = m.operatorCodes[op.opcodeIndex]
                ins = tuple(None if i < 0 else (
                    types[sg.tensors[i].type],
                    0 if sg.tensors[i].quantization is None or sg.tensors[i].quantization.scale
                    is None else len(sg.tensors[i].quantization.scale)) for i in op.inputs)
                expected.append((max(oc.builtinCode, oc.deprecatedBuiltinCode), oc.version, ins))
        got = [(op.code, op.version, tuple(None if t is None else (t.type, t.scales)
                                           for t in op.inputs))
               for op in tflite_model.read_ops_file(path)]
        assert got == expected, path.name


@pytest.mark.parametrize("data, match", [
    (b"", "not a TFLite model"),
    (b"\x10\x00\x00\x00TFL2" + bytes(32), r"not a TFLite model \(file identifier b'TFL2'"),
    (b"\xff\xff\x00\x00TFL3" + bytes(8), "not a valid TFLite flatbuffer"),
])
def test_the_reader_refuses_what_is_not_a_tflite_model(data, match):
    with pytest.raises(BundleError, match=match):
        tflite_model.read_ops(data, "x.tflite")


# ------------------------------------------------------------- what a backend answers wrongly


def test_hybrid_per_channel_fully_connected_is_known_wrong_on_tflite_runtime_only():
    for version in (12, 3):
        path = DATA / f"hybrid_fc_v{version}.tflite"
        (why,) = backends.unrunnable(path, "tflite-runtime")
        assert f"FULLY_CONNECTED with per-channel int8 weights" in why
        assert why.endswith(f"(here version {version})")
        assert backends.unrunnable(path, "litert") == []


def test_the_measurement_behind_the_rule():
    """What KNOWN_WRONG records, measured on whichever backends are here: LiteRT answers the
    per-channel hybrid layer correctly at every op version; tflite-runtime 2.14 answers the
    version-3 marking with errors as large as the outputs and cannot load version 12."""
    if not USABLE:
        pytest.skip("no backend here")
    ref = np.load(DATA / "hybrid_fc.npz")
    x, reference = ref["x"], ref["reference"]
    scale = float(np.abs(reference).max())
    for name in USABLE:
        cls, _ = backends.interpreter_class(name)
        for version in (3, 12):
            path = DATA / f"hybrid_fc_v{version}.tflite"
            if name == "tflite-runtime" and version == 12:
                with pytest.raises(BackendError, match=r"^tflite-runtime cannot run "
                                                       r"hybrid_fc_v12\.tflite: Didn't find op"):
                    cls(model_path=str(path), num_threads=1)
                continue
            it = cls(model_path=str(path), num_threads=1)
            it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            err = float(np.abs(it.get_tensor(it.get_output_details()[0]["index"]) - reference).max())
            if name == "tflite-runtime":
                assert err > 0.5 * scale, (version, err)  # wrong, hence refused
            else:  # int8 activations: close to the float reference, not equal
                assert err < 0.01 * scale, (name, version, err)


def _with_hybrid_file(bundle: Path, dst: Path, version: int) -> tuple[Path, str]:
    """A copy of ``bundle`` whose widest point configuration's file is the hybrid layer (a
    valid bundle: the manifest lists the new file's sha256, and the layer has the digits
    slices' input and output tensors, which load() checks)."""
    shutil.copytree(bundle, dst)
    data = read_manifest(dst).to_dict()
    points = [c for c in data["configurations"] if c["scope"] == "point"]
    c = max(points, key=lambda c: c["width"])
    blob = (DATA / f"hybrid_fc_8x8_v{version}.tflite").read_bytes()
    (dst / c["files"][0]["name"]).write_bytes(blob)
    c["files"][0] = file_entry(c["files"][0]["name"], blob).to_dict()
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst, c["id"]


def _only(dst: Path, cid: str) -> Path:
    """``dst``'s manifest cut to configuration ``cid`` (its uncertainty file dropped too)."""
    data = read_manifest(dst).to_dict()
    data["configurations"] = [c for c in data["configurations"] if c["id"] == cid]
    for c in data["configurations"]:
        c["cascade"] = {}
    data.pop("uncertainty", None)
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst


@pytest.mark.parametrize("version", [12, 3])
def test_a_configuration_its_backend_would_answer_wrongly_is_left_out(bundle, tmp_path,
                                                                      monkeypatch, version):
    copy, cid = _with_hybrid_file(bundle, tmp_path / "b", version)
    m = read_manifest(copy)
    blobs = read_slices(copy, m)
    left = check_bundle(copy, m, "tflite-runtime", blobs)  # the rule needs no interpreter
    assert list(left) == [cid] and f"(here version {version})" in left[cid]
    assert check_bundle(copy, m, "litert", blobs) == {}
    if "tflite-runtime" in USABLE:  # the others answer; the one left out, pinned, says why
        model = edge_sdk.load(copy, profile=None, backend="tflite-runtime")
        assert model.left_out == left and cid not in {c.id for c in model.policy.configs}
        x = np.zeros(model.manifest.input.shape[1:], np.float32)
        with pytest.raises(BackendError, match=rf"^{cid}: backend tflite-runtime would answer "
                                               r"it wrongly \(FULLY_CONNECTED"):
            model.predict(x, config_id=cid)
    # a bundle left with nothing it answers correctly is refused, in one line
    _only(copy, cid)
    if "tflite-runtime" not in USABLE:
        _fake_backends(monkeypatch, {"tflite-runtime"}, others="real")
    with pytest.raises(BackendError) as info:
        edge_sdk.load(copy, profile=None, backend="tflite-runtime")
    msg = str(info.value)
    assert "\n" not in msg
    assert f"backend tflite-runtime cannot run configuration(s) {cid} correctly" in msg
    assert f"(here version {version}); load it with backend='litert' (EDGE_SDK_BACKEND=litert) " \
           f"or re-export with --weights dequantize" in msg
    if "litert" in USABLE:
        assert edge_sdk.load(copy, profile=None, backend="litert").backend == "litert"


def test_profile_measurement_refuses_it_too(bundle, tmp_path, monkeypatch):
    from edge_sdk.policy.measured import measure_profile

    copy, cid = _with_hybrid_file(bundle, tmp_path / "b", 12)
    _only(copy, cid)  # nothing else to measure
    if "tflite-runtime" not in USABLE:
        _fake_backends(monkeypatch, {"tflite-runtime"}, others="real")
    monkeypatch.setenv(ENV_VAR, "tflite-runtime")
    with pytest.raises(BackendError, match="cannot run configuration"):
        measure_profile(copy, [1], repeats=1)
