"""Helpers shared by the device-side tests (torch-free; importable because pytest puts tests/
on sys.path)."""
from __future__ import annotations


class InvokeClock:
    """A fake perf_counter that moves only when an interpreter invokes: each invoke takes
    exactly ``step_ms``, and everything else the SDK does takes no time."""

    def __init__(self, step_ms: float):
        self.t, self.step = 0.0, step_ms / 1000

    def __call__(self) -> float:
        return self.t


def invoke_clock(m: runtime.EdgeModel, step_ms: float) -> runtime.EdgeModel:
    """``m`` on an :class:`InvokeClock`: every configuration built (and warmed up) first, so
    each call's latency is exactly its invokes, ``step_ms`` apiece."""
    clock = InvokeClock(step_ms)
    seen = set()
    for c in m.manifest.configurations:
        for it, *_ in m._interpreters(c):
            if id(it) in seen:  # configurations sharing a file share its interpreter
                continue
            seen.add(id(it))

            def invoke(real=it.invoke):
                real()
                clock.t += clock.step
            it.invoke = invoke
    m._clock = clock
    return m


def without_cascade_targets(data: dict) -> dict:
    """A manifest dict (``Manifest.to_dict()``) without schema version 8's per-target cascade
    plans, in place: what a test that rewrites a bundle as an older version removes."""
    for c in data.get("configurations", []):
        for e in (c.get("cascade") or {}).values():
            if isinstance(e, dict):
                e.pop("targets", None)
    return data


def without_val_accuracy(data: dict) -> dict:
    """A manifest dict without schema version 10's ``val_accuracy`` per configuration, in
    place: what a test that rewrites a bundle as an older version removes."""
    for c in data.get("configurations", []):
        if isinstance(c, dict):
            c.pop("val_accuracy", None)
    return data
