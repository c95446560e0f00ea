"""The layer kinds trainer.nest brought in for torchvision's CNN families (issue 35), run by the
device-side backends: each float slice of tests/edge_sdk/data/layer_kinds_*.tflite (written by
data/make_layer_kinds.py from tiny nested networks) equals the torch truncation's logits within
1e-5 relative. In CI's tflite-runtime step this is the check that tflite-runtime 2.14 runs the
grouped convs (GATHER / SLICE / CONCATENATION, a partial conv group), HARD_SWISH, LOGISTIC, the
squeeze-excitation MUL, PADV2 / PAD pooling, non-square kernels, RESIZE_* and pre-activation
batch norms as the workstation's torch computes them; tests/exporters/test_any_cnn.py checks
the same kinds on LiteRT at every width, from torch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_sdk import backends
from edge_sdk.tflite import model_info as tflite_model

DATA = Path(__file__).resolve().parent / "data"
NPZ = DATA / "layer_kinds.npz"
# case -> TFLite builtin operator codes its slice must hold (what the case is there to run)
KINDS = {
    "grouped": {36: "GATHER", 65: "SLICE", 2: "CONCATENATION"},
    "hardswish_se": {117: "HARD_SWISH", 18: "MUL", 21: "RELU6"},
    "silu_se": {14: "LOGISTIC", 18: "MUL"},
    "pools": {60: "PADV2", 34: "PAD", 17: "MAX_POOL_2D", 1: "AVERAGE_POOL_2D"},
    "non_square": {2: "CONCATENATION"},
    "upsampling": {97: "RESIZE_NEAREST_NEIGHBOR", 23: "RESIZE_BILINEAR"},
    "pre_activation": {2: "CONCATENATION"},
    "stage_stream": {117: "HARD_SWISH", 0: "ADD"},
}


USABLE = backends.usable()


@pytest.fixture(scope="module")
def fixtures():
    if not NPZ.exists():
        pytest.skip(f"{NPZ.name} is absent: write it with "
                    ".venv/bin/python tests/edge_sdk/data/make_layer_kinds.py")
    with np.load(NPZ) as z:
        return {k: z[k] for k in z.files}


def _run(interp_cls, data: bytes, x: np.ndarray) -> np.ndarray:
    it = interp_cls(model_content=data, num_threads=1)
    idx = it.get_input_details()[0]["index"]
    it.resize_tensor_input(idx, list(x.shape))  # exported with batch 1; the batch resizes
    it.allocate_tensors()
    it.set_tensor(idx, x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_every_case_has_its_slice_and_holds_the_ops_it_is_there_to_run(fixtures):
    for case, kinds in KINDS.items():
        path = DATA / f"layer_kinds_{case}.tflite"
        assert path.exists() and f"{case}_x" in fixtures and f"{case}_ref" in fixtures, case
        codes = {op.code for op in tflite_model.read_ops(path.read_bytes(), path.name)}
        missing = [name for code, name in kinds.items() if code not in codes]
        assert not missing, f"{path.name} holds none of {missing}"


@pytest.mark.parametrize("backend", USABLE or [pytest.param("none", marks=pytest.mark.skip(
    reason="no TFLite backend is installed"))])
@pytest.mark.parametrize("case", list(KINDS))
def test_the_backend_runs_each_layer_kind_as_torch_computes_it(fixtures, backend, case):
    interp_cls, _ = backends.interpreter_class(backend)
    x, ref = fixtures[f"{case}_x"], fixtures[f"{case}_ref"]
    got = _run(interp_cls, (DATA / f"layer_kinds_{case}.tflite").read_bytes(), x)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err <= 1e-5, f"{case} on {backend}: {err:.2e} relative"
