"""The one timer the benchmarks share: median wall milliseconds of repeated calls (this machine
is shared and noisy, so medians, never means or single runs)."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after ``warmup``
    untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
