"""Issue 19 §5: model.record(path) writes every prediction in the demo's budget-trace format,
so `edge-sdk report BUNDLE --trace` works on an app's real traffic. Real bundle; the format is
checked with the report's own reader when the workstation side is installed."""
from __future__ import annotations

import json

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import ConfigError
from edge_sdk.policy.budget import Budget

PLENTY_MB = 1e6


@pytest.fixture
def m(bundle):
    return edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)


@pytest.fixture
def xs(m):
    lo, hi = m.input_spec.value_range
    return np.random.default_rng(0).uniform(lo, hi, (4, *m.input_spec.shape[1:])) \
        .astype(np.float32)


def test_every_prediction_is_recorded_in_order_with_its_phase(m, xs, tmp_path):
    path = tmp_path / "trace.json"
    with m.record(path) as rec:
        singles = [m.predict(x) for x in xs]
        rec.phase = "battery saver"
        batch = m.predict_batch(xs, Budget(latency_ms=50.0))
    m.predict(xs[0])  # after close(): not recorded
    data = json.loads(path.read_text())
    recs = data["records"]
    assert [r["step"] for r in recs] == list(range(len(xs) * 2))
    assert [r["phase"] for r in recs] == ["live"] * len(xs) + ["battery saver"] * len(xs)
    for r, p in zip(recs, singles + batch):
        assert (r["config_id"], r["latency_ms"], r["invoke_ms"], r["budget_met"],
                r["confidence"], r["batch_size"]) == \
            (p.config_id, p.latency_ms, p.invoke_ms, p.budget_met, p.confidence, p.batch_size)
        assert r["correct"] is None
    assert recs[-1]["budget_latency_ms"] == 50.0 and recs[0]["budget_latency_ms"] is None
    assert data["run"]["backend"] == m.backend


def test_the_report_reads_the_recorded_trace(m, xs, tmp_path):
    trace = pytest.importorskip("exporters.report.trace", exc_type=ImportError)  # blocked: skip
    path = tmp_path / "trace.json"
    with m.record(path, phase="live"):
        for x in xs:
            m.predict(x)
    records = trace.load_trace(path)
    (summary,) = trace.trace_summary(records)
    assert summary["phase"] == "live" and summary["calls"] == len(xs)
    assert summary["accuracy"] is None  # no labels in an app's traffic


def test_records_are_flushed_as_they_come(m, xs, tmp_path):
    path = tmp_path / "trace.json"
    rec = m.record(path, flush_every=2)
    m.predict(xs[0])
    assert not path.exists()
    m.predict(xs[1])
    assert len(json.loads(path.read_text())["records"]) == 2
    rec.close()


def test_one_recorder_at_a_time_and_bad_paths_are_typed(m, tmp_path):
    rec = m.record(tmp_path / "a.json")
    with pytest.raises(ConfigError, match="already recording"):
        m.record(tmp_path / "b.json")
    rec.close()
    m.record(tmp_path / "b.json").close()  # free again
    with pytest.raises(ConfigError, match="does not exist"):
        m.record(tmp_path / "missing" / "t.json")
    with pytest.raises(ConfigError, match="flush_every"):
        m.record(tmp_path / "c.json", flush_every=0)
