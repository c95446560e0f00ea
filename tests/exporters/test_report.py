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
        widths=[0.5, 1.0], samples=2, scopes=("point", "head", "all"), measure=False,
        max_eval=50), **QUIET))


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


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of every Markdown table in ``text``."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip("|").split("|")])
        elif block:
            tables.append((block[0], block[2:]))
            block = []
    return tables


def test_report_md_prints_no_table_twice(report, manifest):
    text = report[0].read_text(encoding="utf-8")
    tables = _tables(text)
    headers = [tuple(h) for h, _ in tables]
    assert len(set(headers)) == len(headers), headers
    # on the manifest's own data, each quality number is printed once: in the manifest table
    per_config = [h for h in headers if h[0] == "configuration"]
    for column in ("accuracy", "NLL", "ECE", "Brier"):
        assert sum(column in h for h in per_config) == 1, (column, per_config)
    cells = [(row[0], h[i]) for h, rows in tables for row in rows for i in range(1, len(h))]
    assert len(cells) == len(set(cells))  # no (configuration, column) pair twice
    assert "reproduces the table above (largest difference over the configurations: " \
        "accuracy 0" in text
    assert "ECE (T = 1)" in text and "mean MI (nats)" in text  # what the manifest lacks


def test_trace_budgets_are_rounded(bundle, tmp_path):
    records = trace_records()
    for r in records:
        if r["phase"] == "battery saver":
            r["budget_latency_ms"], r["budget_memory_mb"] = 0.0107421875, 3.551834106445
    text = write_report(bundle, tmp_path / "out", trace=records, max_eval=10,
                        log=lambda *a: None).read_text(encoding="utf-8")
    row = next(r for h, rows in _tables(text) if h[0] == "phase" for r in rows
               if r[0] == "battery saver")
    assert row[2:4] == ["0.0107", "3.55"], row
    assert "0.0107421875" not in text and "3.5518" not in text


def _pixels_near(fig, ax, rgb, tol=60) -> int:
    """Pixels of colour ``rgb`` inside ``ax`` once drawn (legends removed first)."""
    for a in fig.axes:
        if a.get_legend() is not None:
            a.get_legend().remove()
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    box = ax.get_window_extent()
    h = img.shape[0]
    crop = img[int(h - box.y1) + 2:int(h - box.y0) - 2, int(box.x0) + 2:int(box.x1) - 2]
    return int((np.abs(crop - np.array(rgb)).sum(-1) < tol).sum())


def test_width_plot_keeps_the_point_line_visible_under_an_identical_head(manifest):
    from types import SimpleNamespace

    from exporters import report as R

    def results(configs):  # every scope scores exactly like the point slice of its width
        return {c.id: R.ConfigResult(probs=np.zeros((1, 2)),
                                     metrics={"accuracy": 0.8 + 0.1 * c.width, "ece": 0.1},
                                     raw_metrics={"ece": 0.2}) for c in configs}

    point = [c for c in manifest.configurations if c.scope == "point"]
    assert {c.scope for c in manifest.configurations} == {"point", "head", "all"}
    blue = (31, 119, 180)  # C0: the point line
    alone = R._width_figure(SimpleNamespace(configurations=point), results(point))
    seen_alone = _pixels_near(alone, alone.axes[0], blue)
    fig = R._width_figure(manifest, results(manifest.configurations))
    seen = _pixels_near(fig, fig.axes[0], blue)
    assert seen_alone > 200
    assert seen >= 0.15 * seen_alone, (seen, seen_alone)  # hidden before: 0 pixels


def test_trace_plot_shows_memory_used_beside_the_budget():
    from exporters.report import _trace_figure

    records = trace_records()
    need = {"w1.00-point": 0.6, "w0.50-point": 0.2}
    fig = _trace_figure(records, need)
    mem = fig.axes[2]
    lines = {ln.get_label(): ln for ln in mem.get_lines()}
    assert {"memory used (chosen configuration)", "memory budget"} <= set(lines)
    used = lines["memory used (chosen configuration)"].get_ydata()
    assert list(used) == [need[r["config_id"]] for r in records]
    assert mem.get_ylabel() == "memory (MB)"
    # without per-configuration memory, the budget alone is drawn, as before
    assert [ln.get_label() for ln in _trace_figure(records).axes[2].get_lines()] \
        == ["memory budget"]


def test_reliability_bins_with_few_samples_are_pale():
    from edge_sdk.answers import metrics as M
    from exporters.report import FEW_BIN_SAMPLES, _figure, _reliability_cell

    rng = np.random.default_rng(0)
    conf = np.r_[np.full(3, 0.55), np.full(200, 0.95)]  # a sparse bin and a full one
    probs = np.stack([conf, 1 - conf], 1)
    labels = np.where(rng.random(conf.size) < conf, 0, 1)
    bins = M.reliability_bins(probs, labels)
    assert sorted(bins.counts[bins.counts > 0]) == [3, 200] and 3 < FEW_BIN_SAMPLES <= 200
    ax = _figure().subplots()
    _reliability_cell(ax, bins)
    bars = {round(c.patches[0].get_x(), 3): (c.get_label(), c.patches[0])
            for c in ax.containers if c.get_label().startswith("accuracy")}
    (sparse_label, sparse), (full_label, full) = (bars[round(bins.edges[k], 3)] for k in (8, 14))
    assert sparse.get_alpha() < 0.5 and sparse.get_hatch() and "pale" in sparse_label
    assert (full.get_alpha() or 1.0) == 1.0 and not full.get_hatch() and full_label == "accuracy"


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
        # the manifest keeps 4 significant digits of a test metric (exporters.configs._sig)
        assert res.metrics["accuracy"] == pytest.approx(exported["accuracy"], rel=5e-4), c.id
        assert res.metrics["nll"] == pytest.approx(exported["nll"], rel=5e-4), c.id
        assert res.metrics["ece"] == pytest.approx(exported["ece"], rel=5e-4), c.id
        assert res.raw_metrics["accuracy"] == pytest.approx(c.test["raw"]["accuracy"], rel=5e-4)
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
    # other data: the recomputed numbers are new, so the full table is there
    assert "| configuration | accuracy | NLL | ECE | ECE (T = 1) | Brier |" in text
    assert "reproduces the table above" not in text


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


def test_the_uncertainty_section_matches_the_runtime(report, bundle, manifest):
    """Issue 33: per width, the share in distribution and the LAC coverage the report prints
    are what the runtime's own answers give on the same evaluation data."""
    import numpy as np

    import edge_sdk
    from exporters.report import load_eval_data

    path, _ = report
    text = path.read_text(encoding="utf-8")
    assert "## Uncertainty" in text and "uncertainty.png" in text
    assert_png(path.parent / "uncertainty.png")
    header, rows = next(t for t in _tables(text) if t[0][:2] == ["width", "configuration"])
    data = load_eval_data(manifest, log=lambda *a: None)
    model = edge_sdk.load(bundle, profile=None)
    mean = np.asarray(manifest.input.mean, np.float32)
    std = np.asarray(manifest.input.std, np.float32)
    raw = np.clip(data.x * std + mean, *manifest.input.value_range)
    for row in rows:
        b = model.predict_batch(raw, config_id=row[1])
        assert float(row[2]) == pytest.approx(b.in_distribution.mean(), abs=1e-3)
        col = header.index("LAC α=0.1: coverage / size / worst class")
        cov = float(row[col].split(" / ")[0])
        hit = b.prediction_sets[np.arange(len(data.y)), data.y]
        assert cov == pytest.approx(hit.mean(), abs=1e-3)
