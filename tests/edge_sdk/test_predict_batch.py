"""Issue 19 §4, runtime side: predict_batch runs ONE invoke per interpreter for the whole batch
(input resized to [N, ...]) under one policy decision and a per-batch budget, and answers
exactly what N single calls answer; version-1 bundles (batch 1 only) loop. Real bundle (schema
2, batch dimension 0), no torch."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import edge_sdk
from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.errors import BudgetError, InputError
from edge_sdk.policy.budget import Budget

PLENTY_MB = 1e6


@pytest.fixture(scope="module")
def xs(bundle):
    spec = read_manifest(bundle).input
    lo, hi = spec.value_range
    return np.random.default_rng(0).uniform(lo, hi, (9, *spec.shape[1:])).astype(np.float32)


def counting(m):
    """``m`` whose interpreters count their invokes (warm-up included) in ``m.invokes``."""
    m.invokes = []
    real = m._build

    def build(c, *files):
        interps = real(c, *files)
        for it, *_ in interps:
            def counted(inner=it.invoke, cid=c.id):
                m.invokes.append(cid)
                inner()
            it.invoke = counted
        return interps

    m._build = build
    return m


def load(b, **kw):
    return counting(edge_sdk.load(b, memory_reader=lambda: PLENTY_MB, **kw))


def test_the_test_bundle_is_batch_resizable(bundle):
    assert read_manifest(bundle).batch_resizable


def test_one_invoke_per_interpreter_for_the_whole_batch(bundle, xs):
    m = load(bundle)
    for c in m.manifest.configurations:
        m.predict_batch(xs, config_id=c.id)  # built, warmed, resized
        m.invokes.clear()
        preds = m.predict_batch(xs, config_id=c.id)
        assert len(preds) == len(xs) and m.invokes == [c.id] * c.invokes


@pytest.mark.parametrize("n", [1, 2, 9])
def test_a_batch_answers_what_single_calls_answer(bundle, xs, n):
    m = load(bundle)
    for c in m.manifest.configurations:
        batch = m.predict_batch(xs[:n], config_id=c.id)
        for x, b in zip(xs[:n], batch):
            s = m.predict(x, config_id=c.id)
            assert (b.label, b.config_id, b.abstain) == (s.label, s.config_id, s.abstain)
            np.testing.assert_allclose(b.probs, s.probs, rtol=0, atol=1e-5)
            assert b.entropy == pytest.approx(s.entropy, abs=1e-5)
            assert b.mutual_info == pytest.approx(s.mutual_info, abs=1e-5)


def test_one_policy_decision_per_batch(bundle, xs):
    m = load(bundle)
    before = m.policy._calls
    preds = m.predict_batch(xs)
    assert m.policy._calls == before + 1
    assert len({p.config_id for p in preds}) == 1


def test_the_budget_is_per_batch(bundle, xs):
    m = load(bundle)
    preds = m.predict_batch(xs, Budget(latency_ms=1e6))
    assert {p.batch_size for p in preds} == {len(xs)}
    assert len({(p.latency_ms, p.invoke_ms) for p in preds}) == 1  # the batch's own times
    assert all(p.budget_met for p in preds)
    tight = m.predict_batch(xs, Budget(latency_ms=preds[0].latency_ms / 1e4))
    assert not any(p.budget_met for p in tight)


def test_a_batch_is_learned_apart_from_single_calls(bundle, xs):
    m = load(bundle)
    c = m.manifest.configurations[0]
    for _ in range(3):
        m.predict_batch(xs, config_id=c.id)
    assert (c.id, len(xs)) in m.policy._measured
    assert m.policy.predicted_latency_ms(c, len(xs)) != m.policy.predicted_latency_ms(c)


def test_an_unmeasured_batch_is_predicted_as_n_single_calls(bundle):
    m = load(bundle)
    c = m.manifest.configurations[0]
    assert m.policy.predicted_latency_ms(c, 8) == pytest.approx(
        8 * m.policy.predicted_latency_ms(c))


@pytest.fixture(scope="module")
def version1(bundle, tmp_path_factory):
    """The test bundle with no batch dimension recorded: what a version-1 bundle reads as."""
    dst = tmp_path_factory.mktemp("v1") / "b"
    shutil.copytree(bundle, dst)
    data = read_manifest(dst, verify=False).to_dict()
    data["batch_dim"] = None
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    assert not read_manifest(dst).batch_resizable
    return dst


def test_a_bundle_without_a_batch_dimension_loops_and_answers_alike(version1, bundle, xs):
    m, ref = load(version1), load(bundle)
    c = m.manifest.configurations[0]
    m.predict(xs[0], config_id=c.id)
    m.invokes.clear()
    preds = m.predict_batch(xs, config_id=c.id)
    assert m.invokes == [c.id] * (c.invokes * len(xs))  # one invoke per sample
    for a, b in zip(preds, ref.predict_batch(xs, config_id=c.id)):
        np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-5)


def test_mixing_batches_and_single_calls_resizes_back(bundle, xs):
    m = load(bundle)
    c = m.manifest.configurations[0]
    single = m.predict(xs[0], config_id=c.id).probs
    m.predict_batch(xs, config_id=c.id)
    assert m.predict(xs[0], config_id=c.id).probs == pytest.approx(single, abs=1e-6)
    m.predict_batch(xs[:3], config_id=c.id)
    assert m.predict(xs[0], config_id=c.id).probs == pytest.approx(single, abs=1e-6)


def test_cascade_runs_its_second_stage_on_the_unsure_samples_only(bundle, xs):
    m = load(bundle, policy="cascade", target_accuracy=0.95)
    plan = m.policy.preview(Budget(), len(xs))
    preds = m.predict_batch(xs)
    assert {p.config_id for p in preds} <= {s.config.id for s in plan.stages}
    for p in preds:  # an answer from an early stage is one it was confident about
        stage = next(s for s in plan.stages if s.config.id == p.config_id)
        assert stage.accept is None or p.confidence >= stage.accept


def test_bad_batches_are_typed(bundle, xs):
    m = load(bundle)
    with pytest.raises(BudgetError):
        m.predict_batch(xs, 5)
    with pytest.raises(InputError, match="N >= 1"):
        m.predict_batch(xs[:0])
    with pytest.raises(InputError, match="masked"):
        m.predict_batch(np.ma.masked_array(xs))
