"""The demo's pipeline end to end in a reduced form (train -> PWFN -> export -> runtime trace ->
report), checking what it leaves behind rather than how fast it ran."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("torch", exc_type=ImportError)

import edge_sdk  # noqa: E402
from edge_sdk.bundle import read_manifest  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", params=["pwfn", "sqs"])
def demo(request, tmp_path_factory):
    from demos.digits_budget import run

    out = tmp_path_factory.mktemp(f"demo-{request.param}")
    paths = run(out, request.param, quick=True, samples=2, calls=25, progress=False)
    return {**paths, "method": request.param}


@pytest.fixture(scope="module")
def records(demo):
    return json.loads(demo["trace"].read_text())["records"]


def test_every_stage_leaves_its_artifact(demo):
    for key in ("checkpoint", "bundle", "trace", "report", "summary"):
        assert demo[key].exists(), key
    assert demo["checkpoint"].parent.name == demo["method"]  # the quantized one was exported
    assert read_manifest(demo["bundle"]).source["posterior"] == demo["method"]


def test_bundle_loads_and_every_width_predicts(demo):
    model = edge_sdk.load(demo["bundle"], threads=1)
    widths = {c.width for c in model.manifest.configurations}
    assert widths == {0.25, 0.5, 0.75, 1.0}
    spec = model.input_spec
    x = np.full(spec.shape[1:], spec.value_range[1] / 2, np.float32)
    for c in model.manifest.configurations:
        p = model.predict(x, config_id=c.id)
        assert p.config_id == c.id and p.width == c.width
        assert abs(sum(p.probs) - 1) < 1e-6 and 0 <= p.label < len(model.manifest.labels)


def test_report_and_figures_are_written_and_non_empty(demo):
    text = demo["report"].read_text()
    manifest = read_manifest(demo["bundle"])
    for c in manifest.configurations:
        assert c.id in text
    pngs = sorted(demo["report"].parent.glob("*.png"))
    assert len(pngs) >= 4  # reliability, width curves, risk-coverage, trace
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, png
        assert png.name in text, f"{png.name} is not referenced by the report"


def test_trace_covers_every_phase_and_respects_the_budgets(demo, records):
    manifest = read_manifest(demo["bundle"])
    by_id = {c.id: c for c in manifest.configurations}
    phases = defaultdict(list)
    for r in records:
        phases[r["phase"]].append(r)
    assert list(phases) == ["unconstrained", "battery saver", "CPU shared", "recovered",
                            "memory squeeze", "cascade"]
    assert all(len(rs) == 25 for rs in phases.values())
    # memory is decided from the manifest, not from timings: every call must fit the squeeze
    squeeze = phases["memory squeeze"]
    assert all(by_id[r["config_id"]].memory_mb <= r["budget_memory_mb"] for r in squeeze)
    assert all(r["budget_met"] for r in squeeze + phases["unconstrained"] + phases["recovered"])
    # a tighter latency budget never buys a costlier configuration (by the manifest's latency).
    # The runtime decides on its live estimates, so two configurations whose manifest latencies
    # differ by less than their timing noise may swap places: allow 3 % (one run failed on
    # phase means of 0.031726 vs 0.031720 ms, 0.02 % apart)
    # A network's precision variants (float, dynamic range, int8 kernels) answer alike and the
    # policy takes whichever its live estimates call fastest: a network costs its cheapest
    net = {c.id: min(v.latency_ms for v in manifest.configurations
                     if v.variant_of == c.variant_of) for c in manifest.configurations}
    cost = lambda rs: np.mean([net[r["config_id"]] for r in rs])  # noqa: E731
    budget = lambda name: phases[name][0]["budget_latency_ms"]  # noqa: E731
    # the demo may give both phases the same budget (the tightest one a configuration met on
    # >= 99 % of its warm-up calls): then they are one constraint and which of two equally
    # fitting configurations answers is timing noise, not a costlier choice
    # The rule orders configurations that fit. A phase whose calls mostly miss their budget
    # is in the "nothing fits" regime, where the policy answers with the configuration its live
    # estimates call fastest end to end: a full test run (the demo shares the pytest process)
    # gave CPU shared 0.0323 ms, below w0.25-point's ~0.035 ms end to end, and its calls split
    # between w0.25 and w0.50 by estimate noise (manifest-latency means 0.00519 vs 0.00372 ms)
    fitted = lambda name: np.mean([r["budget_met"] for r in phases[name]])  # noqa: E731
    if budget("CPU shared") < budget("battery saver") and fitted("CPU shared") >= 0.8:
        assert cost(phases["CPU shared"]) <= 1.03 * cost(phases["battery saver"])
    assert cost(phases["battery saver"]) <= 1.03 * cost(phases["unconstrained"])
    # the cascade climbs widths within one scope
    assert len({by_id[r["config_id"]].scope for r in phases["cascade"]}) == 1


def test_summary_md_is_generated_from_the_trace_it_sits_next_to(demo, records):
    from demos.summary import summary_markdown

    trace = json.loads(demo["trace"].read_text())
    assert demo["summary"] == demo["trace"].with_name("summary.md")
    assert demo["summary"].read_text() == summary_markdown(trace)
    run = trace["run"]
    assert run["command"].startswith("edge-sdk demo") and "--quick" in run["command"]
    assert set(run["stages"]) == {"train", "quantize", "export", "replay", "report"}
    assert run["total_s"] >= sum(run["stages"].values()) - 0.5  # stage times are rounded
    ids = [c["id"] for c in run["configurations"]]
    assert ids == list(read_manifest(demo["bundle"]).ids)
    for c in {r["config_id"] for r in records}:  # every configuration that answered is listed
        assert f"| {c} |" in demo["summary"].read_text()
