"""The budget-trace format the demo writes (``{"records": [...]}``): validation, reading and
the per-phase summary the report's table and figure are drawn from."""
from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.errors import DataError

__all__ = ["TraceError", "load_trace", "phases", "trace_summary", "validate_trace"]


class TraceError(DataError):
    """A budget-trace file (or its records) is missing, malformed or inconsistent."""


_TRACE_FIELDS = ("step", "phase", "budget_latency_ms", "budget_memory_mb", "config_id", "width",
                 "samples", "latency_ms", "budget_met", "correct", "confidence")


def _trace_fail(path: str, message: str):
    raise TraceError(f"{path}: {message}")


def _trace_number(value: Any, path: str, *, lo: float, hi: float = math.inf,
                  lo_open: bool = False, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)):
        what = "a finite number or null" if optional else "a finite number"
        _trace_fail(path, f"expected {what}, got {value!r}")
    v = float(value)
    if v < lo or (lo_open and v == lo) or v > hi:
        bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
        _trace_fail(path, f"expected a number {bound}, got {v!r}")
    return v


def validate_trace(records: Any, where: str = "trace") -> list[dict[str, Any]]:
    """Checked copies of budget-trace ``records`` (the demo's format), sorted by step.

    Each record: ``step`` int, ``phase`` str, ``budget_latency_ms`` / ``budget_memory_mb``
    number > 0 or null, ``config_id`` str, ``width`` in (0, 1], ``samples`` int >= 1,
    ``latency_ms`` >= 0, ``budget_met`` bool, ``correct`` bool or null, ``confidence`` in
    [0, 1]. Optional (the demo's device replay): ``target_ms`` the latency target a device rule
    held the call to (number > 0 or null), ``rules`` the device rules engaged (rule name ->
    the reading that engaged it), ``simulated`` whether those readings were simulated (bool).
    Other keys are ignored. Raises :class:`TraceError` naming the first problem.
    """
    if not isinstance(records, (list, tuple)):
        _trace_fail(f"{where}.records", f"expected a list of records, got {type(records).__name__}")
    if not records:
        _trace_fail(f"{where}.records", "expected at least one record, got an empty list")
    out = []
    for i, rec in enumerate(records):
        p = f"{where}.records[{i}]"
        if not isinstance(rec, Mapping):
            _trace_fail(p, f"expected a mapping, got {type(rec).__name__}")
        missing = [k for k in _TRACE_FIELDS if k not in rec]
        if missing:
            _trace_fail(p, f"missing key(s) {', '.join(missing)}")
        step = rec["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            _trace_fail(f"{p}.step", f"expected an integer, got {step!r}")
        for key in ("phase", "config_id"):
            if not isinstance(rec[key], str) or not rec[key]:
                _trace_fail(f"{p}.{key}", f"expected a non-empty string, got {rec[key]!r}")
        samples = rec["samples"]
        if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 1:
            _trace_fail(f"{p}.samples", f"expected an integer >= 1, got {samples!r}")
        if not isinstance(rec["budget_met"], bool):
            _trace_fail(f"{p}.budget_met", f"expected true or false, got {rec['budget_met']!r}")
        if rec["correct"] is not None and not isinstance(rec["correct"], bool):
            _trace_fail(f"{p}.correct", f"expected true, false or null, got {rec['correct']!r}")
        rules = rec.get("rules") or {}
        if not isinstance(rules, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in rules.items()):
            _trace_fail(f"{p}.rules", f"expected a mapping of rule names to readings, got "
                                      f"{rules!r}")
        if not isinstance(rec.get("simulated", False), bool):
            _trace_fail(f"{p}.simulated", f"expected true or false, got {rec['simulated']!r}")
        out.append({
            "target_ms": _trace_number(rec.get("target_ms"), f"{p}.target_ms", lo=0.0,
                                       lo_open=True, optional=True),
            "rules": dict(rules), "simulated": rec.get("simulated", False),
            "step": int(step), "phase": rec["phase"], "config_id": rec["config_id"],
            "budget_latency_ms": _trace_number(rec["budget_latency_ms"], f"{p}.budget_latency_ms",
                                               lo=0.0, lo_open=True, optional=True),
            "budget_memory_mb": _trace_number(rec["budget_memory_mb"], f"{p}.budget_memory_mb",
                                              lo=0.0, lo_open=True, optional=True),
            "width": _trace_number(rec["width"], f"{p}.width", lo=0.0, hi=1.0, lo_open=True),
            "samples": int(samples),
            "latency_ms": _trace_number(rec["latency_ms"], f"{p}.latency_ms", lo=0.0),
            "budget_met": rec["budget_met"], "correct": rec["correct"],
            "confidence": _trace_number(rec["confidence"], f"{p}.confidence", lo=0.0, hi=1.0),
        })
    return sorted(out, key=lambda r: r["step"])


def load_trace(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate a budget-trace JSON file ``{"records": [...]}`` (see validate_trace)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from None
    if not isinstance(data, Mapping) or "records" not in data:
        raise TraceError(f"{path}: expected a JSON object with a \"records\" list, got "
                         f"{type(data).__name__}" + (" without \"records\""
                                                     if isinstance(data, Mapping) else ""))
    return validate_trace(data["records"], str(path))


def phases(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """Contiguous runs of one phase: (phase, first index, last index)."""
    runs: list[tuple[str, int, int]] = []
    for i, r in enumerate(records):
        if runs and runs[-1][0] == r["phase"]:
            runs[-1] = (r["phase"], runs[-1][1], i)
        else:
            runs.append((r["phase"], i, i))
    return runs


def trace_summary(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per phase (in order of first appearance): calls, widths used, median latency, fraction
    of calls meeting the budget, accuracy over calls with a known label, mean confidence."""
    records = validate_trace(list(records))
    out = []
    for phase in dict.fromkeys(r["phase"] for r in records):
        rs = [r for r in records if r["phase"] == phase]
        known = [r["correct"] for r in rs if r["correct"] is not None]
        budgets = sorted({r["budget_latency_ms"] for r in rs if r["budget_latency_ms"] is not None})
        memory = sorted({r["budget_memory_mb"] for r in rs if r["budget_memory_mb"] is not None})
        out.append({
            "phase": phase, "calls": len(rs),
            "latency_budgets_ms": budgets, "memory_budgets_mb": memory,
            "widths": sorted({r["width"] for r in rs}),
            "mean_width": float(np.mean([r["width"] for r in rs])),
            "median_latency_ms": float(np.median([r["latency_ms"] for r in rs])),
            "budget_met": float(np.mean([r["budget_met"] for r in rs])),
            "accuracy": float(np.mean(known)) if known else None,
            "mean_confidence": float(np.mean([r["confidence"] for r in rs])),
        })
    return out
