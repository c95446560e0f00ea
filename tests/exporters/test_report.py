"""``edge-sdk report`` on a real (tiny) bundle: report and figures written, the recomputed
numbers agree with the manifest's, risk–coverage maths on hand-made data, trace validation.

One tiny digits model is trained once per module (2 epochs) and exported like the runtime
tests' bundle (widths 0.5 and 1.0, 2 samples, no measurement, 50 evaluation samples).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.bundle import MANIFEST_NAME, Manifest, manifest_to_yaml, read_manifest
from edge_sdk.errors import BundleError, DataError, InputError
from exporters.report import (TraceError, evaluate_configuration, load_eval_data, load_trace,
                              plot_trace, risk_coverage, selective_accuracy, trace_summary,
                              validate_trace, write_report)

QUIET = {"progress": False, "log": lambda *a: None}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- helpers


def trace_records(n: int = 30) -> list[dict]:
    """A synthetic demo trace: three phases, the latency budget dropping then recovering, a
    memory squeeze in the middle, unlabelled calls at the end."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        phase = ("normal", "battery saver", "recovered")[3 * i // n]
        squeeze = phase == "battery saver"
        width = 0.5 if squeeze else 1.0
        budget = 0.05 if squeeze else 1.0
        latency = float(rng.uniform(0.01, 0.08) if squeeze else rng.uniform(0.1, 0.3))
        out.append({"step": i, "phase": phase, "budget_latency_ms": budget,
                    "budget_memory_mb": 8.0 if squeeze else None,
                    "config_id": f"w{width:.2f}-point", "width": width, "samples": 1,
                    "latency_ms": latency, "budget_met": latency <= budget,
                    "correct": None if i >= n - 3 else bool(rng.random() < 0.9),
                    "confidence": float(rng.uniform(0.3, 1.0))})
    return out


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), f"{path} is not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > 100, (path, width, height)
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        im.verify()  # a truncated or corrupt file raises


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("torch", exc_type=ImportError)
    pytest.importorskip("matplotlib")
    from exporters.export import ExportOptions, export_bundle
    from trainer.config import load_config
    from trainer.train import train

    work = tmp_path_factory.mktemp("report")
    cfg = load_config("digits", ["train.epochs=2", "train.eval_every=100",
                                 "data.calib_samples=64"])
    res = train(cfg, work / "run", **QUIET)
    return Path(export_bundle(res.checkpoint, work / "bundle", ExportOptions(
        widths=[0.5, 1.0], samples=2, measure=False, max_eval=50), **QUIET))


@pytest.fixture(scope="module")
def manifest(bundle) -> Manifest:
    return read_manifest(bundle)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    path.write_text(json.dumps({"records": trace_records()}))
    return path


@pytest.fixture(scope="module")
def report(bundle, trace_file) -> tuple[Path, list[str]]:
    printed: list[str] = []
    path = write_report(bundle, bundle.parent / "out", trace=trace_file, log=printed.append)
    return path, printed


# --------------------------------------------------------------------------- the report


def test_report_lists_every_configuration_and_valid_figures(report, manifest):
    path, printed = report
    assert path.name == "report.md" and path.is_file()
    text = path.read_text(encoding="utf-8")
    for c in manifest.configurations:
        assert f"`{c.id}`" in text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert {"reliability.png", "width.png", "risk_coverage.png", "trace.png"} <= set(images)
    for name in images:
        assert_png(path.parent / name)
    # the paths are printed, the report last (scripts chain on it); no temp files left behind
    assert printed[-1] == str(path)
    assert {str(path.parent / name) for name in images} <= set(printed)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]
    for phase in ("normal", "battery saver", "recovered"):
        assert phase in text


def test_default_out_dir_is_next_to_the_bundle(bundle, tmp_path):
    copy = shutil.copytree(bundle, tmp_path / "mybundle")
    path = write_report(copy, log=lambda *a: None)
    assert path == tmp_path / "mybundle-report" / "report.md"
    assert "trace.png" not in path.read_text(encoding="utf-8")  # no trace given


def test_recomputed_metrics_match_the_manifest(bundle, manifest):
    data = load_eval_data(manifest, log=lambda *a: None)
    assert data.same_as_manifest
    assert len(data.y) == 50  # the cap the bundle was exported with (source.max_eval)
    for c in manifest.configurations:
        res = evaluate_configuration(bundle, c, data)
        exported = c.test["calibrated"]
        assert res.metrics["accuracy"] == pytest.approx(exported["accuracy"], abs=1e-6), c.id
        assert res.metrics["nll"] == pytest.approx(exported["nll"], abs=1e-6), c.id
        assert res.metrics["ece"] == pytest.approx(exported["ece"], abs=1e-6), c.id
        assert res.raw_metrics["accuracy"] == pytest.approx(c.test["raw"]["accuracy"], abs=1e-6)
        assert res.probs.shape == (50, len(manifest.labels))


def test_max_eval_and_explicit_eval_data(manifest):
    data = load_eval_data(manifest, max_eval=20, log=lambda *a: None)
    assert len(data.y) == 20 and data.x.shape[1:] == tuple(manifest.input.shape[1:])
    other = load_eval_data(manifest, eval_data="digits", max_eval=30, log=lambda *a: None)
    assert not other.same_as_manifest and len(other.y) == 30 and "`digits`" in other.description


def test_bundle_without_data_config_needs_eval_data(bundle, tmp_path):
    old = shutil.copytree(bundle, tmp_path / "old")
    data = read_manifest(old).to_dict()
    del data["source"]["data"]
    (old / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    with pytest.raises(BundleError, match="--eval-data"):
        write_report(old, tmp_path / "out", log=lambda *a: None)
    assert not (tmp_path / "out" / "report.md").exists()
    path = write_report(old, tmp_path / "out", eval_data="digits", max_eval=40,
                        log=lambda *a: None)
    text = path.read_text(encoding="utf-8")
    assert "`digits`" in text and "40 samples" in text
    assert "Δ accuracy" not in text  # other data than the manifest's: no difference column


def test_cli_writes_the_report(bundle, tmp_path, capsys):
    from exporters.cli import report_main

    assert report_main([str(bundle), "--out", str(tmp_path / "cli"), "--max-eval", "10"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == str(tmp_path / "cli" / "report.md")
    assert (tmp_path / "cli" / "risk_coverage.png").is_file()


# --------------------------------------------------------------------------- risk–coverage


def test_risk_coverage_hand_made():
    conf = [0.6, 0.9, 0.8, 0.3, 0.8]
    correct = [True, True, False, False, True]
    rc = risk_coverage(conf, correct)
    # sorted: 0.9 ok | 0.8 bad, 0.8 ok (tied: cut together) | 0.6 ok | 0.3 bad
    np.testing.assert_allclose(rc.coverage, [0.2, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(rc.accuracy, [1.0, 2 / 3, 3 / 4, 3 / 5])
    np.testing.assert_allclose(rc.threshold, [0.9, 0.8, 0.6, 0.3])
    assert selective_accuracy(conf, correct, 0.8) == pytest.approx((0.6, 2 / 3))
    cov, acc = selective_accuracy(conf, correct, 0.95)
    assert cov == 0 and np.isnan(acc)


@pytest.mark.parametrize("seed", range(5))
def test_risk_coverage_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    conf = np.round(rng.uniform(0.1, 1.0, n), 2)  # rounding makes ties
    correct = rng.random(n) < conf
    rc = risk_coverage(conf, correct)
    assert np.all(np.diff(rc.coverage) > 0) and rc.coverage[-1] == 1.0
    assert np.all(np.diff(rc.threshold) < 0)
    assert rc.accuracy[-1] == pytest.approx(correct.mean())
    for cov, acc, thr in zip(rc.coverage, rc.accuracy, rc.threshold):
        kept = conf >= thr
        assert cov == pytest.approx(kept.mean())
        assert acc == pytest.approx(correct[kept].mean())


def test_risk_coverage_rejects_bad_input():
    with pytest.raises(InputError, match="shape"):
        risk_coverage([0.5, 0.6], [True])
    with pytest.raises(InputError, match="non-empty"):
        risk_coverage([], [])
    with pytest.raises(InputError, match="finite"):
        risk_coverage([0.5, np.nan], [True, False])


# --------------------------------------------------------------------------- trace


def test_plot_trace_writes_a_png(tmp_path):
    path = plot_trace(trace_records(), tmp_path / "t.png")
    assert path == tmp_path / "t.png"
    assert_png(path)


def test_trace_summary_per_phase():
    records = trace_records()
    rows = trace_summary(records)
    assert [r["phase"] for r in rows] == ["normal", "battery saver", "recovered"]
    assert sum(r["calls"] for r in rows) == len(records)
    squeeze = rows[1]
    assert squeeze["widths"] == [0.5] and squeeze["memory_budgets_mb"] == [8.0]
    mine = [r for r in records if r["phase"] == "battery saver"]
    assert squeeze["budget_met"] == pytest.approx(np.mean([r["budget_met"] for r in mine]))
    last = [r for r in records if r["phase"] == "recovered" and r["correct"] is not None]
    assert rows[2]["accuracy"] == pytest.approx(np.mean([r["correct"] for r in last]))


def _broken(**change) -> list[dict]:
    records = trace_records(6)
    for key, value in change.items():
        if value is KeyError:
            del records[2][key]
        else:
            records[2][key] = value
    return records


@pytest.mark.parametrize("content, match", [
    ("{not json", "invalid JSON at line 1"),
    ("[1, 2]", 'expected a JSON object with a "records" list'),
    ('{"rows": []}', 'without "records"'),
    ('{"records": []}', "at least one record"),
    ('{"records": {"a": 1}}', "expected a list of records"),
    (json.dumps({"records": _broken(width=KeyError)}), r"records\[2\]: missing key\(s\) width"),
    (json.dumps({"records": _broken(width=1.5)}), r"records\[2\]\.width: expected a number"),
    (json.dumps({"records": _broken(latency_ms="fast")}), r"records\[2\]\.latency_ms"),
    (json.dumps({"records": _broken(budget_latency_ms=-1)}), r"budget_latency_ms"),
    (json.dumps({"records": _broken(correct="yes")}), r"records\[2\]\.correct"),
    (json.dumps({"records": _broken(budget_met=1)}), r"records\[2\]\.budget_met"),
    (json.dumps({"records": _broken(step=2.5)}), r"records\[2\]\.step"),
    (json.dumps({"records": _broken(samples=0)}), r"records\[2\]\.samples"),
    (json.dumps({"records": _broken(phase="")}), r"records\[2\]\.phase"),
    (json.dumps({"records": _broken(confidence=1.2)}), r"records\[2\]\.confidence"),
])
def test_malformed_trace_raises_typed_error(tmp_path, content, match):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=match) as info:
        load_trace(path)
    assert isinstance(info.value, DataError)


def test_missing_trace_file_and_records_in_python(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "absent.json")
    with pytest.raises(TraceError, match=r"trace\.records\[2\]\.width"):
        plot_trace(_broken(width="wide"), tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()
    ok = validate_trace(list(reversed(trace_records(5))))
    assert [r["step"] for r in ok] == [0, 1, 2, 3, 4]  # sorted by step


def test_bad_trace_fails_before_any_evaluation(bundle, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"records": _broken(confidence="high")}))
    with pytest.raises(TraceError, match="confidence"):
        write_report(bundle, tmp_path / "out", trace=bad, log=lambda *a: None)
    assert not (tmp_path / "out").exists()
