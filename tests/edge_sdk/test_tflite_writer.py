"""The graph description and the torch-free TFLite writer (issue 20): every op on small hand-made
graphs, run in LiteRT, against a numpy reference; int8 routes; the resizable batch; the
description's JSON/YAML round trip; typed errors; imports with torch blocked. No torch here, and
no LiteRT needed (runs on the EDGE_SDK_BACKEND chosen)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

from edge_sdk.backends import interpreter_class
from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph, graph_stats
from edge_sdk.tflite.tensors import Quantization
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.tflite.schema import BUILTIN_CODES, OPTIONS_TYPES, TENSOR_TYPES
from edge_sdk.tflite.writer import write_tflite

# the backend the device tests run on (LiteRT, or tflite-runtime 2.14 in CI's device venv): a
# device materialising slices with this writer runs them there
Interpreter = interpreter_class()[0]
RNG = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(buf: bytes, **inputs) -> dict[str, np.ndarray]:
    it = Interpreter(model_content=buf, num_threads=1)
    return it.get_signature_runner("serving_default")(**inputs)


def one_op(build, x: np.ndarray) -> np.ndarray:
    """A graph ``input -> build(g, input) -> out``, written and run in LiteRT."""
    g = GraphBuilder()
    g.mark_output(build(g, g.add_input("input", x.shape)), "out")
    return run(g.finish(), input=x)["out"]


# ---- numpy references (float64) --------------------------------------------------------------
def _same_pads(n: int, k: int, s: int) -> tuple[int, int]:
    """TFLite SAME: output ceil(n / s), the extra padding row at the end."""
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def conv_ref(x, w, b, stride, padding, depthwise=False):
    """x NHWC, w OHWI (or [1, kh, kw, C] depthwise)."""
    _, kh, kw, _ = w.shape
    if padding == "SAME":
        (t, bo), (le, r) = _same_pads(x.shape[1], kh, stride), _same_pads(x.shape[2], kw, stride)
        x = np.pad(x, [(0, 0), (t, bo), (le, r), (0, 0)])
    n, h, wd, c = x.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = []
    for i in range(oh):
        row = []
        for j in range(ow):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :].astype(float)
            if depthwise:
                row.append((patch * w[0]).sum((1, 2)))
            else:
                row.append(np.einsum("nhwc,ohwc->no", patch, w.astype(float)))
        out.append(np.stack(row, 1))
    return np.stack(out, 1) + (0 if b is None else b)


def pool_ref(x, k, s, fn):
    n, h, w, c = x.shape
    return np.stack([np.stack([fn(x[:, i:i + k, j:j + k, :].astype(float), axis=(1, 2))
                               for j in range(0, w - k + 1, s)], 1)
                     for i in range(0, h - k + 1, s)], 1)


def close(got, want, rtol=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= rtol * max(np.abs(want).max(), 1.0), \
        np.abs(got - want).max()


# ---- every op ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stride,padding,act", [(1, "SAME", None), (2, "VALID", "relu"),
                                                (2, "SAME", "relu6"), (1, "VALID", None)])
def test_conv_2d(stride, padding, act):
    x, w, b = rand(2, 7, 7, 3), rand(5, 3, 3, 3), rand(5)
    got = one_op(lambda g, i: g.conv2d(i, g.add_const(w, "w"), g.add_const(b, "b"), stride=stride,
                                       padding=padding, activation=act, name="conv"), x)
    want = conv_ref(x, w, b, stride, padding)
    want = {None: want, "relu": np.maximum(want, 0), "relu6": np.clip(want, 0, 6)}[act]
    close(got, want)


def test_conv_2d_without_bias_gets_zeros():
    x, w = rand(1, 5, 5, 2), rand(4, 1, 1, 2)
    close(one_op(lambda g, i: g.conv2d(i, g.add_const(w, "w"), None, padding="VALID",
                                       name="c"), x), conv_ref(x, w, None, 1, "VALID"))


@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (2, "VALID")])
def test_depthwise_conv_2d(stride, padding):
    x, w, b = rand(2, 8, 8, 4), rand(1, 3, 3, 4), rand(4)
    got = one_op(lambda g, i: g.depthwise_conv2d(i, g.add_const(w, "w"), g.add_const(b, "b"),
                                                 stride=stride, padding=padding,
                                                 activation="relu6", name="dw"), x)
    close(got, np.clip(conv_ref(x, w, b, stride, padding, depthwise=True), 0, 6))


@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected(bias):
    x, w, b = rand(3, 6), rand(4, 6), rand(4)
    got = one_op(lambda g, i: g.fully_connected(
        i, g.add_const(w, "w"), g.add_const(b, "b") if bias else None, activation="relu",
        name="fc"), x)
    close(got, np.maximum(x.astype(float) @ w.T.astype(float) + (b if bias else 0), 0))


def test_add_concatenation_relu_relu6():
    a, b = rand(2, 3, 3, 4) * 5, rand(2, 3, 3, 2) * 5

    def build(g, i):
        j = g.add_input("other", b.shape)
        s = g.add(i, g.concatenation([j, j], 3, name="cat2"), activation="relu6", name="sum")
        c = g.concatenation([g.relu(i, name="r"), g.relu6(j, name="r6"), s], axis=-1, name="cat")
        return g.reshape(c, (-1, 3 * 3 * 10), name="flat")

    g = GraphBuilder()
    g.mark_output(build(g, g.add_input("input", a.shape)), "out")
    got = run(g.finish(), input=a, other=b)["out"]
    s = np.clip(a + np.concatenate([b, b], 3), 0, 6)
    want = np.concatenate([np.maximum(a, 0), np.clip(b, 0, 6), s], 3).reshape(2, -1)
    close(got, want)


def test_pools_mean_pad_softmax():
    x = rand(2, 6, 6, 3)
    close(one_op(lambda g, i: g.max_pool2d(i, 2, name="p"), x), pool_ref(x, 2, 2, np.max))
    close(one_op(lambda g, i: g.average_pool2d(i, 3, 1, name="p"), x), pool_ref(x, 3, 1, np.mean))
    close(one_op(lambda g, i: g.mean(i, (1, 2), name="m"), x), x.mean((1, 2)))
    close(one_op(lambda g, i: g.mean(i, (1, 2), keep_dims=True, name="m"), x),
          x.mean((1, 2), keepdims=True))
    pads = [(0, 0), (1, 2), (0, 1), (0, 0)]
    close(one_op(lambda g, i: g.pad(i, pads, name="p"), x), np.pad(x, pads))
    y = rand(2, 5)
    e = np.exp(y - y.max(1, keepdims=True))
    close(one_op(lambda g, i: g.softmax(i, name="s"), y), e / e.sum(1, keepdims=True))


def test_dequantize_is_exact_and_versioned_per_channel():
    """DEQUANTIZE computes int8 x scale in float32, bit for bit (the exact route)."""
    q = RNG.integers(-127, 128, (3, 4), dtype=np.int8)
    scale = np.array([0.5, 0.037, 3.0], np.float32)
    x = np.eye(4, dtype=np.float32)
    g = GraphBuilder()
    i = g.add_input("input", x.shape)
    w = g.dequantize(g.add_const(q, "w_int8", Quantization(tuple(scale), 0)), "w")
    g.mark_output(g.fully_connected(i, w, None, name="fc"), "out")
    buf = g.finish()
    got = run(buf, input=x)["out"]  # x = I: the rows of the output are the weight's columns
    assert np.array_equal(got.T, q.astype(np.float32) * scale[:, None])
    from edge_sdk.tflite.model_info import read_ops

    assert [(o.name, o.version) for o in read_ops(buf)] == [("DEQUANTIZE", 5),
                                                            ("FULLY_CONNECTED", 1)]


def test_hybrid_filters_are_versioned_and_close_to_float():
    x, w = rand(2, 6, 6, 3), rand(8, 3, 3, 3)
    step = np.abs(w).reshape(8, -1).max(1) / 127
    q = np.clip(np.rint(w / step[:, None, None, None]), -127, 127).astype(np.int8)
    deq = q.astype(np.float32) * step[:, None, None, None].astype(np.float32)
    g = GraphBuilder()
    i = g.add_input("input", x.shape)
    c = g.conv2d(i, g.add_const(q, "wq", Quantization(tuple(step), 0)), g.add_const(rand(8), "b"),
                 padding="VALID", name="conv")
    g.mark_output(c, "out")
    buf = g.finish()
    from edge_sdk.tflite.model_info import read_ops

    assert [(o.name, o.version) for o in read_ops(buf)] == [("CONV_2D", 5)]
    got = run(buf, input=x)["out"]
    ref = conv_ref(x, deq, g.weights["b"], 1, "VALID")
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 0 < err < 0.05  # activations quantized per invoke: close, not equal


# ---- batch, serialisation, stats ---------------------------------------------------------------
def _small_net() -> GraphBuilder:
    g = GraphBuilder()
    x = g.add_input("input", (1, 6, 6, 2))
    c = g.conv2d(x, g.add_const(rand(4, 3, 3, 2), "w"), g.add_const(rand(4), "b"),
                 activation="relu", name="conv")
    p = g.max_pool2d(c, 2, name="pool")
    f = g.reshape(p, (-1, 36), name="flat")
    g.mark_output(g.fully_connected(f, g.add_const(rand(5, 36), "fc_w"), None, name="fc"), "logits")
    return g


def test_resizable_batch_n_rows_equal_n_single_invokes():
    graph, weights = _small_net().graph(resizable_batch=True)
    buf = write_tflite(graph, weights)
    from edge_sdk.tflite.model_info import read_io

    (inp,), (out,) = read_io(buf)
    assert inp.shape_signature == (-1, 6, 6, 2) and out.shape_signature == (-1, 5)
    xs = rand(4, 6, 6, 2)
    it = Interpreter(model_content=buf, num_threads=1)
    it.resize_tensor_input(it.get_input_details()[0]["index"], list(xs.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], xs)
    it.invoke()
    batched = it.get_tensor(it.get_output_details()[0]["index"])
    singles = np.concatenate([run(buf, input=x[None])["logits"] for x in xs])
    assert batched.shape == (4, 5)
    assert np.abs(batched - singles).max() <= 1e-5 * max(1.0, np.abs(singles).max())
    fixed, _ = _small_net().graph(resizable_batch=False)
    assert read_io(write_tflite(fixed, weights))[0][0].shape_signature is None


def test_description_round_trips_through_json_and_yaml():
    graph, weights = _small_net().graph(resizable_batch=True)
    buf = write_tflite(graph, weights)
    for text in (json.dumps(graph.to_dict()), yaml.safe_dump(graph.to_dict())):
        again = Graph.from_dict(yaml.safe_load(text))
        assert again == graph and write_tflite(again, weights) == buf
    assert len(json.dumps(graph.to_dict())) < 3000  # weights by reference, not inline


def test_stats_count_macs_and_params():
    graph, _ = _small_net().graph()
    s = graph_stats(graph)
    assert s["macs"] == 6 * 6 * 4 * 9 * 2 + 36 * 5 and s["params"] == 4 * 18 + 4 + 36 * 5
    assert s["ops"] == {"CONV_2D": 1, "MAX_POOL_2D": 1, "RESHAPE": 1, "FULLY_CONNECTED": 1}


# ---- errors ------------------------------------------------------------------------------------
def test_bad_descriptions_are_typed_errors_naming_the_problem():
    graph, weights = _small_net().graph()

    def broken(edit):
        d = json.loads(json.dumps(graph.to_dict()))
        edit(d)
        return Graph.from_dict(d)

    cases = [
        (lambda d: d["ops"][1].update(op="LSTM"), r"LSTM 'pool': unsupported op"),
        (lambda d: d["tensors"][-1].update(shape=[1, 6]), r"recorded as float32 \[1, 6\], "
                                                          r"the op computes float32 \[1, 5\]"),
        (lambda d: d["ops"][0]["options"].update(dilation=2), r"unknown options \['dilation'\]"),
        (lambda d: d["ops"][0]["options"].update(activation="gelu"), "activation must be"),
        (lambda d: d["ops"][2]["options"].update(shape=[-1, 35]), r"cannot reshape"),
        (lambda d: d["ops"][3]["inputs"].__setitem__(0, "nope"), r"input 'nope' is not produced"),
        (lambda d: d.update(version=99), r"version 99 is not supported"),
    ]
    for edit, match in cases:
        with pytest.raises(ConfigError, match=match):
            write_tflite(broken(edit), weights)
    with pytest.raises(ConfigError, match=r"refers to weight 'fc_w'.* do not hold"):
        write_tflite(graph, {k: v for k, v in weights.items() if k != "fc_w"})
    with pytest.raises(ConfigError, match=r"weight 'w' is float32 \[4, 3, 3, 1\], tensor 'w' "
                                          r"expects float32 \[4, 3, 3, 2\]"):
        write_tflite(graph, {**weights, "w": rand(4, 3, 3, 1)})
    with pytest.raises(ConfigError, match="malformed graph description"):
        Graph.from_dict({"version": 1, "tensors": [{"shape": [1]}]})


def test_builder_refuses_bad_shapes_and_values():
    g = GraphBuilder()
    x = g.add_input("input", (1, 4, 4, 2))
    with pytest.raises(ConfigError, match=r"filter \[3, 3, 3, 5\] does not fit an input with 2"):
        g.conv2d(x, g.add_const(rand(3, 3, 3, 5), "w"), None, name="c")
    with pytest.raises(ConfigError, match="ADD needs equal shapes"):
        g.add(x, g.max_pool2d(x, 2, name="p"), name="a")
    with pytest.raises(ConfigError, match="-128"):
        g.add_const(np.full((2, 2), -128, np.int8), "q", Quantization((1.0, 1.0), 0))
    with pytest.raises(ConfigError, match=r"1 scales for axis 0 of shape \[2, 2\]"):
        g.add_const(np.ones((2, 2), np.int8), "q2", Quantization((1.0,), 0))
    with pytest.raises(ConfigError, match="used twice"):
        g.add_input("input", (1, 2))
    for bad in [(-1, -1), (0, 32), (-2, 16), (-1, 5), (2, 17)]:
        with pytest.raises(ConfigError, match="reshape"):
            g.reshape(x, bad, name=f"bad{bad}")


# ---- schema and imports ------------------------------------------------------------------------
def test_schema_numbers_match_litert_generated_schema():
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    assert BUILTIN_CODES == {k: getattr(schema.BuiltinOperator, k) for k in BUILTIN_CODES}
    assert OPTIONS_TYPES == {k: getattr(schema.BuiltinOptions, k) for k in OPTIONS_TYPES}
    assert TENSOR_TYPES == {k: getattr(schema.TensorType, k.upper()) for k in TENSOR_TYPES}
    # the file read back with the generated object API: the fields the writer sets
    graph, weights = _small_net().graph(resizable_batch=True)
    buf = write_tflite(graph, weights)
    m = schema.ModelT.InitFromPackedBuf(buf, 0)
    assert buf[4:8] == b"TFL3" and m.version == 3 and not m.buffers[0].data
    sg = m.subgraphs[0]
    conv = sg.operators[0]
    o = conv.builtinOptions
    assert conv.builtinOptionsType == schema.BuiltinOptions.Conv2DOptions
    assert (o.padding, o.strideH, o.strideW, o.fusedActivationFunction, o.dilationHFactor) == (
        schema.Padding.SAME, 1, 1, schema.ActivationFunctionType.RELU, 1)
    names = [t.name.decode() for t in sg.tensors]
    assert names[:3] == ["input", "w", "b"] and "flat/shape" in names
    assert list(sg.operators[3].inputs)[2] == -1  # FULLY_CONNECTED without a bias
    assert [s.signatureKey.decode() for s in m.signatureDefs] == ["serving_default"]
    base = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    root = schema.Model.GetRootAs(buf, 0)
    for i in range(1, root.BuffersLength()):  # schema: force_align 16
        assert (root.Buffers(i).DataAsNumpy().__array_interface__["data"][0] - base) % 16 == 0


def test_the_writer_imports_and_writes_with_torch_and_the_generated_schema_blocked():
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch" or name == "ai_edge_litert.schema_py_generated":
                    raise ModuleNotFoundError(f"{name} is blocked", name=name)
        sys.meta_path.insert(0, Block())
        import numpy as np
        from edge_sdk.tflite.build import GraphBuilder
        import edge_sdk.tflite.writer
        g = GraphBuilder()
        x = g.add_input("input", (1, 4))
        g.mark_output(g.fully_connected(x, g.add_const(np.ones((2, 4), np.float32), "w"), None,
                                        name="fc"), "out")
        buf = g.finish(resizable_batch=True)
        assert buf[4:8] == b"TFL3"
        bad = [m for m in sys.modules if m.split(".")[0] == "torch" or "schema_py" in m]
        assert not bad, bad
        print("ok", len(buf))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok ")


def test_cast_takes_a_uint8_input_and_nothing_else_takes_uint8():
    """Issue 34's raw input: CAST turns a uint8 input into float32 (the interpreter agrees,
    value for value); a uint8 tensor anywhere else, or a CAST of float32, is refused."""
    g = GraphBuilder()
    x = g.add_input("x", (1, 2, 2, 3), np.uint8)
    g.mark_output(g.op("CAST", [x], "f"), "f")
    cls, _ = interpreter_class()
    it = cls(model_content=g.finish(), num_threads=1)
    it.allocate_tensors()
    px = np.arange(12, dtype=np.uint8).reshape(1, 2, 2, 3) * 21
    it.set_tensor(it.get_input_details()[0]["index"], px)
    it.invoke()
    out = it.get_tensor(it.get_output_details()[0]["index"])
    assert out.dtype == np.float32 and np.array_equal(out, px.astype(np.float32))
    bad = GraphBuilder()
    u = bad.add_input("u", (1, 2, 2, 3), np.uint8)
    with pytest.raises(ConfigError, match="'u' must be float32, got uint8"):
        bad.relu(u, name="r")
    f = bad.add_input("f", (1, 2, 2, 3))
    with pytest.raises(ConfigError, match="must be a uint8 tensor"):
        bad.op("CAST", [f], "c")
