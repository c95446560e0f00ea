"""An in-process trace recorder: every prediction a loaded model makes, in the budget-trace
format the demo writes (``{"records": [...], "run": {...}}``), so ``edge-sdk report BUNDLE
--trace FILE`` works for an app's real traffic, not only the demo's.

    with model.record("trace.json") as rec:   # or rec = model.record(...); ...; rec.close()
        rec.phase = "battery saver"           # optional: label the calls that follow
        model.predict(x, budget)

Records are kept in memory and written atomically (temp file + rename) by ``flush()``, every
``flush_every`` records and at ``close()``; ``correct`` is null (the app knows no labels).
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from edge_sdk.errors import ConfigError

if TYPE_CHECKING:
    from edge_sdk.policy.budget import Budget
    from edge_sdk.answers.prediction import Prediction


class TraceRecorder:
    """``run``: what the trace's run block says of the model (bundle, backend, policy,
    threads); ``on_close``: called with the recorder when it stops (the model forgets it)."""

    def __init__(self, run: Mapping[str, Any], on_close: Callable[[TraceRecorder], None],
                 path: str | os.PathLike[str], phase: str = "live",
                 flush_every: int = 1000, max_records: int = 1_000_000) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ConfigError(f"record() needs a file path, got {path!r}")
        for name, v in (("flush_every", flush_every), ("max_records", max_records)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"record(): {name} must be a positive integer, got {v!r}")
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise ConfigError(f"record(): directory {self.path.parent} does not exist")
        self.phase = phase
        self._run = dict(run)
        self._on_close = on_close
        self._flush_every = flush_every
        self._records: deque[dict[str, Any]] = deque(maxlen=max_records)  # oldest dropped beyond max_records
        self._step = 0
        self._lock = threading.Lock()
        self._started = time.time()
        self.closed = False

    def add(self, predictions: Sequence[Prediction], budget: Budget) -> None:
        """Called by the runtime after each call (one record per prediction)."""
        with self._lock:
            if self.closed:
                return
            for p in predictions:
                self._records.append({
                    "step": self._step, "phase": self.phase,
                    "budget_latency_ms": budget.latency_ms, "budget_memory_mb": budget.memory_mb,
                    "config_id": p.config_id, "width": p.width, "samples": p.samples,
                    "latency_ms": p.latency_ms, "invoke_ms": p.invoke_ms,
                    "batch_size": p.batch_size, "budget_met": p.budget_met, "correct": None,
                    "confidence": p.confidence, "abstain": p.abstain})
                self._step += 1
            due = self._step % self._flush_every < len(predictions)
        if due:
            self.flush()

    def flush(self) -> Path:
        with self._lock:
            records = list(self._records)
        run = {"command": "edge_sdk.EdgeModel.record", **self._run, "started": self._started,
               "host": {"cpus": os.cpu_count(),
                        "system": f"{platform.system()} {platform.machine()}",
                        "python": platform.python_version()}}
        text = json.dumps({"records": records, "run": run})
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path

    def close(self) -> Path:
        """Write the trace and stop recording."""
        path = self.flush()
        with self._lock:
            self.closed = True
        self._on_close(self)
        return path

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
