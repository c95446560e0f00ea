"""edge_sdk.answers.ood_graph: the OOD score inside the interpreter. On a tiny slice built here
(logits and features are slices of its input, so any can be fed), the appended ops equal the
numpy reference (both scores, point and head, after a batch resize) on every usable backend
(LiteRT; tflite-runtime 2.14 where it is installed); in a real bundle, every precision's
configuration answers the score its own features give, and the runtime reads the graph's
output rather than scoring in numpy. No torch."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import edge_sdk
from edge_sdk import backends
from edge_sdk.answers.graph import ANSWER, runtime_graph
from edge_sdk.answers.ood_graph import OOD, OodGraph, append_ood, ood_numpy
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.tflite.reader import read_graph

CLASSES, DIM = 10, 24
USABLE = backends.usable()


def split_slice(samples: int) -> bytes:
    """A slice whose input [N, S*C + D] is its logits [N*S, C] followed by its features
    [N, D] (two selection matrices), batch resizable."""
    g = GraphBuilder()
    width = samples * CLASSES + DIM
    x = g.add_input("input", (1, width))
    eye = np.eye(width, dtype=np.float32)
    z = g.fully_connected(x, g.add_const(eye[:samples * CLASSES], "pick_z"), None, name="z")
    f = g.fully_connected(x, g.add_const(eye[samples * CLASSES:], "pick_f"), None, name="f")
    g.mark_output(g.reshape(z, (-1, CLASSES), name="rows"), "logits")
    g.mark_output(f, "features")
    return g.finish()


def unit_bank(rows: int, seed: int) -> np.ndarray:
    b = np.random.default_rng(seed).normal(size=(rows, DIM)).astype(np.float32)
    return b / np.linalg.norm(b, axis=1, keepdims=True)


def run(data: bytes, x: np.ndarray, backend: str) -> dict[str, np.ndarray]:
    cls, _ = backends.interpreter_class(backend)
    it = cls(model_content=data, num_threads=1)
    inp = it.get_input_details()[0]["index"]
    it.resize_tensor_input(inp, list(x.shape))
    it.allocate_tensors()
    it.set_tensor(inp, x)
    it.invoke()
    return {o["name"]: it.get_tensor(o["index"]) for o in it.get_output_details()}


values = st.floats(-20, 20, width=32, allow_nan=False, allow_infinity=False,
                   allow_subnormal=False)  # the interpreter flushes subnormals


@pytest.mark.parametrize("backend", backends.BACKENDS)
@settings(max_examples=40, deadline=None)
@given(samples=st.sampled_from([1, 3]), n=st.sampled_from([1, 5]), fused=st.booleans(),
       rows=st.sampled_from([1, 10, 40]), data=st.data())
def test_the_graph_s_score_is_the_numpy_reference(backend, samples, n, fused, rows, data):
    if backend not in USABLE:
        pytest.skip(f"{backend} is not usable here")
    x = data.draw(hnp.arrays(np.float32, (n, samples * CLASSES + DIM), elements=values))
    spec = OodGraph(unit_bank(rows, rows), (0.7, 1.9, -0.3) if fused else None, samples)
    out = run(runtime_graph(split_slice(samples), None, (1.4, samples), ood=spec), x, backend)
    assert out[OOD].shape == (n,) and out[OOD].dtype == np.float32
    want = ood_numpy(spec, x[:, samples * CLASSES:], x[:, :samples * CLASSES])
    # float32 maths in both; the fused score adds a logsumexp of logits up to 20
    np.testing.assert_allclose(out[OOD], want, rtol=1e-5, atol=1e-5)
    # the slice's own outputs are untouched, and the answer still rides along
    np.testing.assert_array_equal(out["features"], x[:, samples * CLASSES:])
    assert out[ANSWER].shape == (n, CLASSES)


def test_zero_features_score_zero_like_the_reference():
    """L2_NORMALIZATION's epsilon (1e-6) keeps an all-zero feature row (every unit dead)
    finite: its cosine to every row is 0."""
    spec = OodGraph(unit_bank(8, 0))
    x = np.zeros((1, CLASSES + DIM), np.float32)
    got = run(runtime_graph(split_slice(1), None, None, ood=spec), x, USABLE[0])[OOD]
    assert got.tolist() == [0.0] and ood_numpy(spec, x[:, CLASSES:]).tolist() == [0.0]


def test_a_slice_without_features_of_the_bank_s_size_is_left_alone():
    graph, weights = read_graph(split_slice(1))
    assert not append_ood(graph, weights, OodGraph(np.ones((4, DIM + 1), np.float32) / 5))
    assert OOD not in graph.outputs
    g = GraphBuilder()
    x = g.add_input("input", (1, CLASSES))
    g.mark_output(g.reshape(x, (1, CLASSES), name="r"), "logits")
    graph, weights = read_graph(g.finish())
    assert not append_ood(graph, weights, OodGraph(unit_bank(4, 0)))


def test_the_appended_graph_reads_back():
    data = runtime_graph(split_slice(3), None, (1.0, 3), ood=OodGraph(unit_bank(6, 1),
                                                                      (1.0, 1.0, 0.0), 3))
    graph, _ = read_graph(data)
    assert graph.outputs[-2:] == [OOD, ANSWER]
    assert {"L2_NORMALIZATION", "REDUCE_MIN", "REDUCE_MAX", "LOG"} <= {o.op for o in graph.ops}


@pytest.fixture(scope="module")
def precisions(precision_bundle):
    return edge_sdk.load(precision_bundle, profile=None)


def test_every_precision_scores_its_own_features_in_its_graph(precisions):
    """float, dynamic-range and int8 configurations of a width share its bank; each one's
    interpreter computes the score its own features give (numpy on the same outputs)."""
    m = precisions
    unc = m.uncertainty
    assert unc is not None and unc.version == 2
    rng = np.random.default_rng(0)
    lo, hi = m.manifest.input.value_range
    xs = rng.uniform(lo, hi, (6, *m.input_spec.shape[1:])).astype(np.float32)
    seen = set()
    for c in m.manifest.configurations:
        if c.id in m.left_out:  # (tflite-runtime: its hybrid per-channel kernel is wrong)
            continue
        wk = m._unc_width[c.id]
        for x in xs:
            p = m.predict(x, config_id=c.id)
            assert m._ood_at[c.id][0] >= 0  # read from the graph, not numpy
            it, _, out, _ = m._interpreters(c)[0]
            feats = it.get_tensor(m._feature_index(c, it))
            ref = unc.score(wk, feats, it.get_tensor(out))[0]
            assert p.ood_score == pytest.approx(ref, abs=1e-5)
            assert p.in_distribution == (p.ood_score <= unc.widths[wk].threshold)
        seen.add(c.id.rsplit("-", 1)[-1])
    assert {"point", "int8"} <= seen and ("dyn" in seen or m.left_out)
    b = m.predict_batch(xs, config_id=m.manifest.configurations[0].id)
    singles = [m.predict(x, config_id=m.manifest.configurations[0].id).ood_score for x in xs]
    np.testing.assert_allclose(b.ood_score, singles, atol=1e-5)
