"""The demo's summary.md (the README's demo section) is generated from a trace alone: a small
synthetic trace gives markdown holding exactly its figures, and the README's section has the
generator's format. No torch: runs in the device-side CI too."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from demos.digits_budget import command_line, demo_main
from demos.summary import (CONFIG_HEADER, PHASE_HEADER, SUMMARY_BEGIN, SUMMARY_END,
                           summary_markdown, write_summary)
from edge_sdk.errors import InputError

README = Path(__file__).resolve().parents[2] / "README.md"


def _record(step, phase, config, ms, correct, conf, met, abstain, lat=None, mem=None,
            invoke=None):
    return {"step": step, "phase": phase, "budget_latency_ms": lat, "budget_memory_mb": mem,
            "config_id": config, "width": float(config[1:5]), "samples": 8, "latency_ms": ms,
            "invoke_ms": ms / 2 if invoke is None else invoke,
            "budget_met": met, "correct": correct, "confidence": conf, "abstain": abstain}


@pytest.fixture
def trace() -> dict:
    records = [
        # unconstrained: 3 of 4 calls by w1.00-all8, mean 0.25 ms, accuracy 0.75
        _record(0, "unconstrained", "w1.00-all8", 0.3, True, 0.9, True, False),
        _record(1, "unconstrained", "w1.00-all8", 0.3, True, 0.8, True, False),
        _record(2, "unconstrained", "w1.00-all8", 0.3, False, 0.6, True, True),
        _record(3, "unconstrained", "w0.50-head8", 0.1, True, 0.7, True, False),
        # battery saver at 0.0432 ms: half the calls over budget; the SDK's own time per
        # call (0.035, 0.055 ms: median 0.045) is above the budget
        _record(4, "battery saver", "w0.25-point", 0.04, True, 0.5, True, False, lat=0.0432,
                invoke=0.005),
        _record(5, "battery saver", "w0.25-point", 0.06, False, 0.5, False, True, lat=0.0432,
                invoke=0.005),
        # memory squeeze at 3.9612 MB
        _record(6, "memory squeeze", "w0.75-head8", 0.05, True, 0.95, True, False, mem=3.9612),
    ]
    configurations = [
        {"id": "w0.25-point", "acc": 0.8551, "acc_T": 0.8552, "ece": 0.4757, "ece_T": 0.0503,
         "T": 0.2345, "macs": 86848, "kib": 13.04, "latency_ms": 0.0061, "memory_mb": 3.64},
        {"id": "w1.00-all8", "acc": 0.9873, "acc_T": 0.9874, "ece": 0.0689, "ece_T": 0.0181,
         "T": 0.5812, "macs": 1330432, "kib": 1228.93, "latency_ms": None, "memory_mb": None},
    ]
    run = {"command": "edge-sdk demo --quick", "method": "pwfn", "quick": True, "epochs": 3,
           "samples": 8, "calls": 300,
           "host": {"cpus": 2, "system": "Linux x86_64", "python": "3.11.9",
                    "load_average": 5.1},
           "backend": "litert",
           "stages": {"train": 48.94, "quantize": 25.6, "export": 46.2, "replay": 1.4,
                      "report": 12.2},
           "total_s": 145.3, "data": {"train": 1259, "val": 179, "test": 359}, "evaluated": 200,
           "bundle": "runs/demo/bundle", "trace": "runs/demo/trace.json",
           "figure": "runs/demo/report/trace.png", "configurations": configurations}
    return {"records": records, "run": run}


def test_the_summary_holds_the_run_and_its_stage_times(trace):
    md = summary_markdown(trace)
    assert md.startswith(SUMMARY_BEGIN + "\n") and md.endswith(SUMMARY_END + "\n")
    first = md.splitlines()[1]
    assert first.startswith("`edge-sdk demo --quick` on 2 CPUs (Linux x86_64, Python 3.11.9, "
                            "backend `litert`, load average 5.1 when it started): **145.3 s**")
    for part in ("train 48.9 s", "quantize (pwfn) 25.6 s", "export of 2 configurations 46.2 s",
                 "budget replay 1.4 s", "report 12.2 s", "1259 training, 179 validation, 359 test",
                 "3 epochs", "test split, 200 samples", "300 calls per phase",
                 "`runs/demo/trace.json`", "`runs/demo/report/trace.png`",
                 "`runs/demo/bundle/manifest.yaml`"):
        assert part in md, part


def test_the_configuration_table_is_the_traces(trace):
    md = summary_markdown(trace)
    assert CONFIG_HEADER in md
    assert ("| w0.25-point | 0.8551 | 0.8552 | 0.4757 | 0.0503 | 0.23 | 86848 | 13.0 | 0.006 "
            "| 3.6 |") in md
    # not measured (--no-measure): a dash, never a made-up number
    assert "| w1.00-all8 | 0.9873 | 0.9874 | 0.0689 | 0.0181 | 0.58 | 1330432 | 1228.9 | – | – |" \
        in md


def _rows(md: str) -> list[str]:
    after = md[md.index(PHASE_HEADER) + len(PHASE_HEADER):]
    return [ln for ln in after.splitlines() if ln.startswith("| ")]


def test_the_phase_table_is_computed_from_the_records(trace):
    """A budget trace (written before the device rules): its budgets stand in for what drove
    each phase and for the target."""
    md = summary_markdown(trace)
    assert PHASE_HEADER in md
    assert _rows(md) == [
        "| unconstrained | – | w1.00-all8 75%, w0.50-head8 25% | – | – | 0.25 | 0.125 | 0.15 "
        "| 0.750 | 0.750 | – | – | 25.0% |",
        "| battery saver | latency budget 0.0432 ms | w0.25-point 100% | 100% | – | 0.05 "
        "| 0.005 | 0.045 | 0.500 | 0.500 | *0.0432 ms* | 50.0% | 50.0% |",
        "| memory squeeze | memory budget 3.96 MB | w0.75-head8 100% | 100% | – | 0.05 | 0.025 "
        "| 0.025 | 1.000 | 0.950 | – | – | 0.0% |",
    ]


def test_a_budget_is_marked_only_when_below_the_sdks_own_time(trace):
    for r in trace["records"][4:6]:
        r["invoke_ms"] = r["latency_ms"] - 0.01  # the SDK's part 0.01 ms < budget 0.0432 ms
    assert "| 0.01 | 0.500 | 0.500 | 0.0432 ms | 50.0% |" in summary_markdown(trace)
    for r in trace["records"]:
        del r["invoke_ms"]  # a trace written before invoke times were recorded
    md = summary_markdown(trace)
    assert "| w0.25-point 100% | 100% | – | 0.05 | – | – | 0.500 | 0.500 | 0.0432 ms |" in md


def _device_record(step, phase, config, width, rules=None, target=None, ms=0.02, macs=1000):
    return {"step": step, "phase": phase, "budget_latency_ms": None, "budget_memory_mb": None,
            "target_ms": target, "config_id": config, "width": width, "samples": 1,
            "macs": macs, "latency_ms": ms, "invoke_ms": ms - 0.008, "budget_met": True,
            "correct": True, "confidence": 0.9, "abstain": False, "rules": rules or {},
            "simulated": any("(simulated)" in v for v in (rules or {}).values())}


@pytest.fixture
def device_trace(trace) -> dict:
    """A device replay: four phases, the battery rule engaged from the second call of its
    phase on a simulated reading, the contention rule (real) on one call of two; the control
    answers as the phase before it did."""
    low = {"OnBattery": "battery 20 % (simulated), on battery (simulated) (< 30 %)"}
    stall = {"UnderContention": "250 stalls per s of calls, +4 ms each (target p99.9 0.2 ms)"}
    records = [
        _device_record(0, "unconstrained", "w1.00-point", 1.0, macs=4000),
        _device_record(1, "unconstrained", "w1.00-point", 1.0, macs=4000),
        _device_record(2, "battery drain", "w1.00-point", 1.0, macs=4000),
        _device_record(3, "battery drain", "w0.50-point", 0.5, low),
        _device_record(4, "battery drain", "w0.50-point", 0.5, low),
        _device_record(5, "battery drain", "w0.50-point", 0.5, low),
        _device_record(6, "CPU contention (real)", "w0.50-point", 0.5, target=0.2),
        _device_record(7, "CPU contention (real)", "w0.25-point", 0.25, stall, 0.2, ms=4.1),
        _device_record(8, "recovered (control)", "w0.25-point", 0.25),
        _device_record(9, "recovered (control)", "w0.50-point", 0.5),
    ]
    phases = [
        {"phase": "unconstrained", "drive": "plugged in (simulated)", "rule": None,
         "simulated": True, "calls": 2, "engaged_at": None, "effect": None},
        {"phase": "battery drain", "drive": "on battery, 36 % -> 12 % (simulated)",
         "rule": "OnBattery", "simulated": True, "calls": 4, "engaged_at": 1,
         "effect": "the cheapest within 1 pt: w0.50-point"},
        {"phase": "CPU contention (real)", "drive": "a busy process on the model's core",
         "rule": "UnderContention", "simulated": False, "calls": 2, "engaged_at": 1,
         "effect": "no configuration keeps p99.9 under 0.2 ms: the fastest, w0.25-point"},
        {"phase": "recovered (control)", "drive": "plugged in (simulated)", "rule": None,
         "simulated": True, "calls": 2, "engaged_at": None, "effect": None},
    ]
    setup = {"full": "w1.00-point", "p95_ms": 0.02, "target_ms": 0.2, "quantile": 0.999,
             "slower_than": 20.0, "heat_pt": 3.0, "battery_pt": 1.0, "keep_free_mb": 256.0,
             "floor_ms": 0.005, "contention_x": 10}
    return {"records": records, "phases": phases, "setup": setup, "run": trace["run"],
            "skipped": [{"phase": "memory pressure", "why": "no memory reading here"}]}


def test_a_device_replay_says_what_drove_each_phase(device_trace):
    md = summary_markdown(device_trace)
    rows = _rows(md)
    assert len(rows) == 4 and all(ln.count("|") == 14 for ln in rows)
    assert rows[0].startswith("| unconstrained | plugged in (simulated); no rule engaged | "
                              "w1.00-point 100% | – | 4,000 |")
    # the rule, from which call, on simulated readings, and what it decided; 3 of 4 calls
    # moved to width 0.5; the MACs per call are the records' mean
    assert rows[1].startswith(
        "| battery drain | on battery, 36 % -> 12 % (simulated); OnBattery engaged from call 2 "
        "of 4 (75% of calls, on simulated readings); its last decision: the cheapest within 1 "
        "pt: w0.50-point | w0.50-point 75%, w1.00-point 25% | 75% | 1,750 |")
    # a real reading is not marked simulated; the target and the share within it
    assert "UnderContention engaged from call 2 of 2 (50% of calls); its last decision" in md
    assert rows[2].endswith("| 0.2 ms | 50.0% | 0.0% |")
    assert "on simulated readings" not in rows[2]
    assert "`UnderContention(latency_ms=0.2, quantile=0.999, slower_than=20)` (10 x " \
           "w1.00-point's warm-up p95 of 0.02 ms" in md
    # the control may answer as the phase before it did; every other phase moved
    assert "Every phase moved at least 50% of its calls to another width than the phase " \
           "before it, except the control." in md
    assert "Phase *memory pressure* skipped: no memory reading here." in md
    assert "device replay 1.4 s" in md


def test_a_phase_that_did_not_move_is_named(device_trace):
    for r in device_trace["records"][6:8]:  # contention answered as the battery drain did
        r["config_id"], r["width"] = "w0.50-point", 0.5
    md = summary_markdown(device_trace)
    assert "Not every phase moved 50% of its calls to another width than the phase before " \
           "it: *CPU contention (real)* (25% vs *battery drain*)." in md


def test_a_different_trace_gives_different_figures(trace):
    before = summary_markdown(trace)
    trace["records"][0]["latency_ms"] = 1.1  # unconstrained mean 0.25 -> 0.45
    trace["run"]["stages"]["export"] = 7.0
    after = summary_markdown(trace)
    assert "| 0.45 |" in after and "export of 2 configurations 7.0 s" in after
    assert after != before


def test_write_summary_reads_the_trace_file(trace, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    out = write_summary(path)
    assert out == tmp_path / "summary.md"
    assert out.read_text() == summary_markdown(trace)


def test_summary_of_prints_it_for_an_existing_trace(trace, tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert demo_main(["--summary-of", str(path)]) == 0
    assert capsys.readouterr().out == summary_markdown(trace)


@pytest.mark.parametrize("content", ["not json", json.dumps({"records": []})])
def test_summary_of_a_file_that_is_not_a_demo_trace_is_an_input_error(content, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(InputError, match="--summary-of"):
        demo_main(["--summary-of", str(path)])


@pytest.mark.parametrize("kwargs, want", [
    ({}, "edge-sdk demo"),
    ({"quick": True}, "edge-sdk demo --quick"),
    ({"method": "sqs", "out": Path("/tmp/d"), "epochs": 5, "samples": 4, "calls": 25},
     "edge-sdk demo --method sqs --out /tmp/d --epochs 5 --samples 4 --calls 25"),
])
def test_command_line_names_only_what_differs_from_the_defaults(kwargs, want):
    args = {"out": Path("runs/demo"), "method": "pwfn", "quick": False, "epochs": None,
            "samples": 8, "calls": 300, **kwargs}
    assert command_line(**args) == want


def test_the_readme_demo_section_is_a_pasted_summary():
    """The README quotes one summary.md verbatim: between the generator's markers, with its
    sentence and both of its tables in the generator's format."""
    text = README.read_text()
    assert text.count(SUMMARY_BEGIN) == 1 and text.count(SUMMARY_END) == 1
    block = text[text.index(SUMMARY_BEGIN):text.index(SUMMARY_END) + len(SUMMARY_END)]
    lines = block.splitlines()
    assert re.match(r"`edge-sdk demo[^`]*` on \d+ CPUs \(.*\): \*\*[\d.]+ s\*\* wall in all — "
                    r"train [\d.]+ s", lines[1]), lines[1]
    assert CONFIG_HEADER in block and PHASE_HEADER in block
    n_cols = {CONFIG_HEADER: 10, PHASE_HEADER: 13}
    for header, cols in n_cols.items():
        start = lines.index(header.splitlines()[0]) + 2
        rows = []
        for ln in lines[start:]:
            if not ln.startswith("|"):
                break
            rows.append(ln)
        assert rows, header
        assert all(ln.count("|") == cols + 1 for ln in rows), rows
    # the command that produced it is stated next to it
    assert "`make demo`" in text[text.rindex("\n## ", 0, text.index(SUMMARY_BEGIN)):
                                 text.index(SUMMARY_BEGIN)]
