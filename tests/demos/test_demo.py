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


PHASES = ["unconstrained", "thermal throttle", "memory pressure", "CPU contention (real)",
          "battery drain", "recovered (control)", "cascade"]


def test_trace_covers_every_phase_and_its_rules_drove_it(demo, records):
    from demos.device_phases import CONTENTION_X

    trace = json.loads(demo["trace"].read_text())
    manifest = read_manifest(demo["bundle"])
    by_id = {c.id: c for c in manifest.configurations}
    phases = defaultdict(list)
    for r in records:
        phases[r["phase"]].append(r)
    skipped = [s["phase"] for s in trace["skipped"]]  # no os.sched_setaffinity: no contention
    assert list(phases) == [p for p in PHASES if p not in skipped]
    assert skipped in ([], ["CPU contention (real)"])
    for name, rs in phases.items():
        assert len(rs) == 25 * (CONTENTION_X if name == "CPU contention (real)" else 1), name
    assert [p["phase"] for p in trace["phases"]] == list(phases)
    # every record names the rules engaged with their readings, whether those were simulated,
    # the target and the MACs run
    for r in records:
        assert r["simulated"] == any("(simulated)" in v for v in r["rules"].values())
        if r["phase"] != "cascade":
            assert r["macs"] == by_id[r["config_id"]].macs * by_id[r["config_id"]].invokes
        assert (r["target_ms"] is not None) == (r["phase"] == "CPU contention (real)")
    # the simulated phases engage their rule on a simulated reading (the ramps cross the
    # thresholds a quarter into the phase); nothing engages unconstrained or recovered
    for name, rule in (("battery drain", "OnBattery"), ("thermal throttle", "WhenHot"),
                       ("memory pressure", "UnderMemoryPressure")):
        engaged = [r for r in phases[name] if rule in r["rules"]]
        assert engaged and all(r["simulated"] for r in engaged), name
        assert all("(simulated)" in r["rules"][rule] for r in engaged)
    assert all(r["rules"] == {} for r in phases["unconstrained"] + phases["recovered (control)"])
    assert all(set(r["rules"]) <= {"UnderContention"} and not r["simulated"]
               for r in phases.get("CPU contention (real)", []))
    # the memory rule is decided from the manifest's figures: never a slice that needs more
    # than the unconstrained one did
    from edge_sdk.policy.policy import Policy

    need = {c.id: Policy.memory_need_mb(c) for c in manifest.configurations}
    top = max(need[r["config_id"]] for r in phases["unconstrained"])
    assert all(need[r["config_id"]] <= top for r in phases["memory pressure"])
    # a battery rule never buys a costlier network than the unconstrained one
    mean = lambda rs: np.mean([r["macs"] for r in rs])  # noqa: E731
    assert mean([r for r in phases["battery drain"] if r["rules"]]) <= mean(
        phases["unconstrained"])
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


def test_trace_figure_shows_the_target_and_the_rules_that_drove_each_call(records):
    from exporters.report import _trace_figure, validate_trace

    checked = validate_trace(records)  # the device replay's keys survive validation
    assert [r["rules"] for r in checked] == [r["rules"] for r in records]
    assert [r["target_ms"] for r in checked] == [r["target_ms"] for r in records]
    fig = _trace_figure(records)
    lat, state = fig.axes[0], fig.axes[4]
    labels = [ln.get_label() for ln in lat.get_lines()]
    if any(r["target_ms"] is not None for r in records):
        assert "latency target (device rule)" in labels
    rows = [t.get_text() for t in state.get_yticklabels()]
    assert rows == list(dict.fromkeys(n for r in records for n in r["rules"]))
    assert {"OnBattery", "WhenHot", "UnderMemoryPressure"} <= set(rows)
    hatched = [p for p in state.collections if p.get_hatch()]
    assert hatched  # the simulated readings' rules
