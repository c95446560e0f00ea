"""edge_sdk.answers.graph: the runtime's graph of a slice, run by the real interpreter. Fed raw
samples (uint8 or float32), it normalises them as numpy does, bit for bit; the appended answer
is the float64 maths of edge_sdk.answers.metrics to float32 precision, leaves the logits bit-identical,
marks every non-finite logit with a NaN, and survives a batch resize; the runtime answers
through it for point and head slices only, and feeds every slice raw samples. No torch."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import edge_sdk
from edge_sdk.answers import metrics as M
from edge_sdk.answers.graph import ANSWER, RAW_INPUT, RawInput, runtime_graph, with_answer
from edge_sdk.errors import SliceError
from edge_sdk.tflite.reader import read_graph
from edge_sdk.backends import interpreter_class
from edge_sdk.tflite.build import GraphBuilder

CLASSES = 10
PLENTY_MB = 1e6


def logits_passthrough(samples: int) -> bytes:
    """A slice whose logits [S, C] are its input [1, S * C]: any logits can be fed."""
    g = GraphBuilder()
    x = g.add_input("input", (1, samples * CLASSES))
    g.mark_output(g.reshape(x, (samples, CLASSES), name="r"), "logits")
    return g.finish()


def run(data: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    cls, _ = interpreter_class()
    it = cls(model_content=data, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {o["name"]: it.get_tensor(o["index"]) for o in it.get_output_details()}


def reference(logits: np.ndarray, t: float) -> np.ndarray:
    return M.softmax(logits.astype(np.float64), temperature=t).mean(0)


finite = st.floats(-60, 60, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(samples=st.sampled_from([1, 2, 4]), t=st.floats(0.3, 3.0), data=st.data())
def test_the_answer_is_the_mean_tempered_softmax(samples, t, data):
    logits = data.draw(hnp.arrays(np.float32, (samples, CLASSES), elements=finite))
    out = run(with_answer(logits_passthrough(samples), t, samples), logits.reshape(1, -1))
    assert out["logits"].tobytes() == logits.tobytes()  # untouched
    p = out[ANSWER]
    assert p.shape == (1, CLASSES) and p.dtype == np.float32
    np.testing.assert_allclose(p[0], reference(logits, t), rtol=0, atol=1e-6)
    assert math.fsum(p[0].tolist()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("samples", [1, 3])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_logit_makes_a_nan_answer(samples, bad):
    """-inf alone would leave a finite softmax (probability 0): the guard makes it NaN too,
    and np.argmax finds a NaN wherever it is (so the runtime's check of p[argmax] sees it)."""
    logits = np.zeros((samples, CLASSES), np.float32)
    logits[-1, 7] = bad
    p = run(with_answer(logits_passthrough(samples), 1.3, samples), logits.reshape(1, -1))[ANSWER]
    assert np.isnan(p[0, 7])
    assert np.isnan(p[0, int(p.argmax())])


def test_a_graph_that_cannot_take_the_answer_is_left_alone():
    taken = GraphBuilder()
    xi = taken.add_input(ANSWER, (1, CLASSES))
    taken.mark_output(taken.reshape(xi, (1, CLASSES), name="r"), "logits")
    assert with_answer(taken.finish(), 1.0, 1) is None  # a tensor already has the name
    assert with_answer(logits_passthrough(2), 1.0, 3) is None  # [2, C] is not 3 samples


def small_cnn(channels: int, name: str = "input") -> bytes:
    """A batch-resizable conv -> mean -> logits slice on [N, 5, 4, channels] float32."""
    rng = np.random.default_rng(channels)
    g = GraphBuilder()
    x = g.add_input(name, (1, 5, 4, channels))
    h = g.conv2d(x, g.add_const(rng.normal(size=(6, 3, 3, channels)).astype(np.float32), "w"),
                 g.add_const(rng.normal(size=6).astype(np.float32), "b"), padding="SAME",
                 name="conv")
    h = g.fully_connected(g.mean(h, name="gap"), g.add_const(
        rng.normal(size=(CLASSES, 6)).astype(np.float32), "fc"), None, name="fc_out")
    g.mark_output(h, "logits")
    return g.finish(resizable_batch=True)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_the_raw_input_is_normalised_as_numpy_does(dtype, data):
    """Per-channel (x - mean) / std in the graph == numpy's x * (1 / std) + (-mean / std) in
    float32 fed to the slice's own graph: the same logits, bit for bit, at batch 1 and 3."""
    channels = data.draw(st.sampled_from([1, 3]))
    mean = np.asarray(data.draw(st.lists(st.floats(0, 200), min_size=channels,
                                         max_size=channels)), np.float32)
    std = np.asarray(data.draw(st.lists(st.floats(0.5, 80), min_size=channels,
                                        max_size=channels)), np.float32)
    scale, shift = (1.0 / std).astype(np.float32), (-mean / std).astype(np.float32)
    n = data.draw(st.sampled_from([1, 3]))
    x = data.draw(hnp.arrays(np.dtype(dtype), (n, 5, 4, channels), elements=st.integers(
        0, 255) if dtype == "uint8" else st.floats(-300, 300, width=32)))
    plain = small_cnn(channels)
    raw = runtime_graph(plain, RawInput(dtype, tuple(scale.tolist()), tuple(shift.tolist())),
                        None)
    norm = (x * np.broadcast_to(scale, x.shape[1:]) + np.broadcast_to(shift, x.shape[1:]))
    want, got = run_n(plain, norm.astype(np.float32)), run_n(raw, x)
    assert got["logits"].tobytes() == want["logits"].tobytes()


def run_n(data: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`run` with the batch resized to ``len(x)``."""
    cls, _ = interpreter_class()
    it = cls(model_content=data, num_threads=1)
    inp = it.get_input_details()[0]
    assert inp["dtype"] == x.dtype
    it.resize_tensor_input(inp["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(inp["index"], x)
    it.invoke()
    return {o["name"]: it.get_tensor(o["index"]) for o in it.get_output_details()}


def test_the_raw_input_reads_back_and_never_shadows_a_name():
    """The written graph reads back (uint8 input, CAST, the slice's old input an intermediate
    of the same name); a slice already using the name gets a fresh one; a channel count the
    spec does not normalise is refused with both shapes named."""
    plain = small_cnn(3, name=RAW_INPUT)
    graph, _ = read_graph(runtime_graph(plain, RawInput("uint8", (1.0,) * 3, (0.0,) * 3),
                                        (1.0, 1)))
    (src,) = graph.inputs
    assert src != RAW_INPUT and graph.tensor(src).dtype == "uint8"
    assert [o.op for o in graph.ops[:3]] == ["CAST", "MUL", "ADD"]
    assert graph.ops[2].outputs == [RAW_INPUT] and graph.outputs == ["logits", ANSWER]
    with pytest.raises(SliceError, match=r"\[1, 5, 4, 3\].*normalises 1 channels"):
        runtime_graph(plain, RawInput("float32", (1.0,), (0.0,)), None)


@pytest.fixture(scope="module")
def model(bundle):
    return edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)


def test_the_runtime_answers_point_and_head_slices_through_the_graph(model):
    feed = np.dtype(model.input_spec.dtype)
    for c in model.manifest.configurations:
        interps = model._interpreters(c)
        has = [ans >= 0 for _, _, _, ans in interps]
        assert has == [c.scope in ("point", "head")] * len(interps), c.id
        # every slice, all-scope sample files too, takes the raw sample
        assert all(it.get_input_details()[0]["dtype"] == feed for it, *_ in interps), c.id


def test_a_bundle_slice_keeps_its_logits_and_resizes_with_its_answer(model, bundle):
    """Every point and head slice of a real bundle: the runtime's graph fed raw samples gives
    the logits the slice's own graph gives fed numpy's normalisation, bit for bit, at batch 1
    and resized to 3; each sample's answer row is the float64 maths of those logits."""
    spec = model.manifest.input
    xs = np.random.default_rng(1).uniform(*spec.value_range, (3, *spec.shape[1:]))
    xs = xs.astype(np.uint8 if spec.dtype == "uint8" else np.float32)
    xn = np.concatenate([model._prepare(x) for x in xs])
    for c in model.manifest.configurations:
        if c.scope not in ("point", "head"):
            continue
        (plain, inp, out, _), = model._build(c, plain=True)
        (aug, ainp, aout, ans), = model._build(c)
        for it, i, x in ((plain, inp, xn), (aug, ainp, xs)):
            it.resize_tensor_input(i, [3, *spec.shape[1:]])
            it.allocate_tensors()
            it.set_tensor(i, x)
            it.invoke()
        logits = plain.get_tensor(out)
        # the runtime's graph normalises the raw samples itself, as numpy does (x * (1 / std)
        # + (-mean / std) in float32, two roundings): the same bytes
        assert aug.get_tensor(aout).tobytes() == logits.tobytes(), c.id
        rows = logits.reshape(3, -1, CLASSES)
        want = np.stack([reference(r, c.temperature) for r in rows])
        np.testing.assert_allclose(aug.get_tensor(ans), want, rtol=0, atol=1e-6)


def test_answers_through_the_graph_equal_the_numpy_path(bundle):
    """The same calls on a model whose slices answer in numpy (nothing answerable): labels
    equal, probabilities, entropy and MI within float32 precision; one sample and a batch."""
    graph = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    numpy_ = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    numpy_._answerable = {}
    spec = graph.manifest.input
    xs = np.random.default_rng(2).uniform(*spec.value_range, (6, *spec.shape[1:])
                                          ).astype(np.float32)
    for c in graph.manifest.configurations:
        if c.scope not in ("point", "head"):
            continue
        assert graph._interpreters(c)[0][3] >= 0 and numpy_._interpreters(c)[0][3] == -1
        pairs = [(graph.predict(x, config_id=c.id), numpy_.predict(x, config_id=c.id))
                 for x in xs]
        gb, nb = graph.predict_batch(xs, config_id=c.id), numpy_.predict_batch(xs, config_id=c.id)
        pairs += list(zip(gb, nb))
        np.testing.assert_array_equal(gb.labels, nb.labels)
        np.testing.assert_allclose(gb.probs, nb.probs, rtol=0, atol=1e-6)
        np.testing.assert_allclose(gb.entropy, nb.entropy, rtol=0, atol=1e-5)
        np.testing.assert_allclose(gb.mutual_info, nb.mutual_info, rtol=0, atol=1e-6)
        for a, b in pairs:
            assert a.label == b.label, c.id
            np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-6)
            assert a.confidence == pytest.approx(b.confidence, abs=1e-6)
            assert a.entropy == pytest.approx(b.entropy, abs=1e-5)
            assert a.mutual_info == pytest.approx(b.mutual_info, abs=1e-6)
            if c.scope == "point":
                assert a.mutual_info == 0
