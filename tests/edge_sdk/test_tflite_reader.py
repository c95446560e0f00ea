"""edge_sdk.tflite.reader (issue 36): a slice parsed back into the writer's graph description.
Round trips are bit-exact (the writer's bytes re-written from what the reader recovers), and
what the writer never writes, or an unsound graph, is a SliceError naming it. Graphs made here
with GraphBuilder and written by the real writer; the bundle's real slices too. No torch."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from edge_sdk.errors import BundleError, SliceError
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.tflite.reader import MAX_ELEMENTS, read_graph
from edge_sdk.tflite.writer import write_tflite
from fuzz_corpus import anatomy


def _every_op_net(batch: bool = True) -> bytes:
    """A small net using every op the writer knows, int8 weights dequantized and hybrid."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.add_input("x", (1, 6, 6, 2))
    q = SimpleNamespace(scale=np.full(4, 0.02, np.float32), axis=0)
    w = g.dequantize(g.add_const(rng.integers(-127, 127, (4, 3, 3, 2), dtype=np.int8), "w8", q),
                     "w")
    h = g.conv2d(x, w, g.add_const(rng.standard_normal(4).astype(np.float32), "b"),
                 stride=1, padding="SAME", activation="relu", name="conv")
    d = g.depthwise_conv2d(h, g.add_const(rng.standard_normal((1, 3, 3, 4)).astype(np.float32),
                                          "dw"), None, padding="SAME", name="dwconv")
    a = g.add(h, d, activation="relu6", name="add")
    p = g.pad(a, [[0, 0], [1, 1], [1, 1], [0, 0]], name="pad")
    m = g.max_pool2d(p, 2, name="maxpool")
    v = g.average_pool2d(m, 2, 2, "SAME", name="avgpool")
    c = g.concatenation([v, v], axis=-1, name="concat")
    r = g.relu(g.relu6(c, name="r6"), name="r")
    mean = g.mean(r, (1, 2), keep_dims=True, name="mean")
    f = g.reshape(mean, (-1 if batch else 1, 8), name="flat")
    q2 = SimpleNamespace(scale=np.linspace(0.01, 0.05, 3).astype(np.float32), axis=0)
    fc = g.fully_connected(f, g.add_const(rng.integers(-127, 127, (3, 8), dtype=np.int8), "fc8",
                                          q2), None, name="fc")
    g.mark_output(g.softmax(fc, 0.5, name="sm"), "probs")
    return g.finish(resizable_batch=batch)


@pytest.mark.parametrize("batch", [True, False])
def test_a_written_graph_reads_back_and_re_writes_bit_exactly(batch):
    blob = _every_op_net(batch)
    graph, weights = read_graph(blob, "net")
    assert graph.batch_dim == (0 if batch else None)
    assert {o.op for o in graph.ops} >= {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "PAD", "MEAN",
                                         "MAX_POOL_2D", "AVERAGE_POOL_2D", "CONCATENATION",
                                         "RESHAPE", "RELU", "RELU6", "SOFTMAX", "DEQUANTIZE",
                                         "FULLY_CONNECTED"}
    assert write_tflite(graph, weights) == blob


def test_the_bundles_slices_read_back_bit_exactly(bundle):
    for path in sorted(bundle.glob("*.tflite")):
        blob = path.read_bytes()
        assert write_tflite(*read_graph(blob, path.name)) == blob, path.name


def _patched(blob: bytes, pos: int, value: int, fmt: str = "<i") -> bytes:
    b = bytearray(blob)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def test_a_shape_that_lies_is_refused_naming_the_op():
    blob = _every_op_net()
    a = anatomy(blob)
    pos = next(p for n, d, p in a.shape_dims if n == "w" and d == 0)  # DEQUANTIZE's output
    with pytest.raises(SliceError, match=r"net: DEQUANTIZE \['w'\]: output recorded as float32 "
                                         r"\[3, 3, 3, 2\], the op computes float32 \[4, 3, 3, 2\]"):
        read_graph(_patched(blob, pos, 3), "net")


@pytest.mark.parametrize("value, message", [
    (-5, r"tensor index -5 out of range"), (999, r"tensor index 999 out of range")])
def test_operator_indices_out_of_range_are_refused(value, message):
    blob = _every_op_net()
    _, _, _, pos = anatomy(blob).op_inputs[0]
    with pytest.raises(SliceError, match=message):
        read_graph(_patched(blob, pos, value), "net")


def test_a_self_loop_is_refused():
    blob = _every_op_net()
    a = anatomy(blob)
    k, op, slot, pos = next(i for i in a.op_inputs if i[1] == "CONV_2D" and i[2] == 0)
    with pytest.raises(SliceError, match=r"is not produced before it"):
        read_graph(_patched(blob, pos, a.op_io[k][1][0]), "net")


def test_a_reshape_constant_that_disagrees_is_refused():
    blob = _every_op_net()
    _, pos, _ = next(c for c in anatomy(blob).int32_consts if c[0].startswith("flat"))
    with pytest.raises(SliceError, match=r"shape operand \[7, 8\] and new_shape \[-1, 8\] "
                                         r"disagree"):
        read_graph(_patched(blob, pos, 7), "net")


def test_a_nan_constant_is_refused():
    blob = _every_op_net()
    _, weights = read_graph(blob, "net")
    at = blob.index(weights["b"].astype("<f4").tobytes())  # the float bias's buffer data
    bad = blob[:at] + np.float32(np.nan).tobytes() + blob[at + 4:]
    with pytest.raises(SliceError, match=r"constant 'b' holds NaN or infinite values"):
        read_graph(bad, "net")


def test_a_field_the_writer_never_sets_is_refused():
    """The Model's vtable made to say its metadata_buffer (field 5) is present: any present
    field outside a table's whitelist is refused, since an interpreter would act on it."""
    blob = bytearray(_every_op_net())
    root = struct.unpack_from("<I", blob, 0)[0]
    vt = root - struct.unpack_from("<i", blob, root)[0]
    vsize = struct.unpack_from("<H", blob, vt)[0]
    # Model's vtable covers fields 0..7; point field 5 (metadata_buffer) at field 0's slot
    field0 = struct.unpack_from("<H", blob, vt + 4)[0]
    assert vsize >= 4 + 2 * 6
    struct.pack_into("<H", blob, vt + 4 + 2 * 5, field0)
    with pytest.raises(SliceError, match=r"Model sets field\(s\) \[5\], which edge-sdk's writer "
                                         r"never writes"):
        read_graph(bytes(blob), "net")


@pytest.mark.parametrize("cut", [0, 3, 8, 100, -1, -200])
def test_truncated_or_tiny_files_are_typed(cut):
    blob = _every_op_net()
    data = blob[:cut] if cut > 0 else blob[:len(blob) + cut] if cut < 0 else b""
    with pytest.raises(SliceError):
        read_graph(data, "net")


def test_every_random_byte_edit_is_read_or_typed():
    """A thousand random edits of the tables: each reads back (and then is sound) or is a
    SliceError, never another exception."""
    blob = _every_op_net()
    rng = np.random.default_rng(7)
    spans = anatomy(blob).weight_spans
    outcomes = {"read": 0, "refused": 0}
    for _ in range(1000):
        b = bytearray(blob)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, len(b)))
            if any(s <= pos < e for s, e in spans):
                continue
            b[pos] = int(rng.integers(0, 256))
        try:
            graph, weights = read_graph(bytes(b), "net")
            graph.validate(weights)
            outcomes["read"] += 1
        except SliceError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 500, outcomes


def test_huge_shapes_are_refused_before_anything_allocates():
    g = GraphBuilder()
    x = g.add_input("x", (1, 4))
    g.mark_output(g.relu(x, name="r"), "y")
    blob = g.finish()
    a = anatomy(blob)
    pos = next(p for n, d, p in a.shape_dims if n == "x" and d == 1)
    with pytest.raises(SliceError, match=rf"at most {MAX_ELEMENTS} elements"):
        read_graph(_patched(blob, pos, 1 << 30), "net")


def test_slice_errors_are_bundle_errors():
    assert issubclass(SliceError, BundleError)
