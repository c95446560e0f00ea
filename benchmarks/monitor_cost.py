"""What the device rules cost a call: the same model's policy-chosen ``predict`` in a tight loop,
rounds alternated back to back with the rules (all four, the default psutil readers, the monitor's
timer running) and without them; per round the mean and p99 of the call as the app waits it.

    python benchmarks/runtime.py --bundle runs/demo/bundle --only monitor [--rounds 9]

Run on an idle host: the figure is a difference of microseconds.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

import edge_sdk
from edge_sdk.device.contention import Contention
from edge_sdk.device.monitor import DeviceMonitor
from edge_sdk.device.readers import Readers
from edge_sdk.device.state import Signal
from edge_sdk.policy.rules import RuleSet


def _round(model, x, calls: int) -> tuple[float, float]:
    pc, t = time.perf_counter, []
    predict = model.predict
    for _ in range(calls):
        t0 = pc()
        predict(x)
        t.append(pc() - t0)
    a = np.asarray(t) * 1e6
    return float(a.mean()), float(np.percentile(a, 99))


def monitor_table(bundle: str, x, rounds: int = 9, calls: int = 20000) -> dict:
    model = edge_sdk.load(bundle, threads=1)
    pol = model.policy
    # a target no call misses: the rule runs its per-call bookkeeping and never engages
    rules = [edge_sdk.OnBattery(), edge_sdk.WhenHot(), edge_sdk.UnderMemoryPressure(),
             edge_sdk.UnderContention(latency_ms=1000.0)]
    signal = Signal()
    monitor = DeviceMonitor(Readers(memory=pol.memory.read), 0.1, signal=signal)
    contention = Contention(target_ms=1000.0, signal=signal)
    ruleset = RuleSet(rules, pol, monitor, contention, pol.configs)
    for _ in range(2000):
        model.predict(x)  # warm: the variants measured, the incumbent settled
    rows = {"off": [], "on": []}
    for r in range(rounds):
        for mode in (("on", "off") if r % 2 else ("off", "on")):
            if mode == "on":
                monitor.start()
                pol.use_rules(ruleset, contention)
            else:
                pol.use_rules(None, None)
                monitor.stop()
            model.predict(x)
            rows[mode].append(_round(model, x, calls))
    monitor.stop()
    print(f"{'round':>5}{'off mean us':>13}{'on mean us':>12}{'off p99 us':>12}{'on p99 us':>11}")
    for i, (a, b) in enumerate(zip(rows["off"], rows["on"])):
        print(f"{i:>5}{a[0]:>13.2f}{b[0]:>12.2f}{a[1]:>12.2f}{b[1]:>11.2f}")
    d_mean = [b[0] - a[0] for a, b in zip(rows["off"], rows["on"])]
    d_p99 = [b[1] - a[1] for a, b in zip(rows["off"], rows["on"])]
    out = {"mean_us": statistics.median(d_mean), "p99_us": statistics.median(d_p99),
           "rounds": rounds, "calls": calls, "chosen": model.predict(x).config_id}
    print(f"the rules add {out['mean_us']:+.2f} us mean, {out['p99_us']:+.2f} us p99 per call "
          f"(median of {rounds} paired rounds of {calls} calls; answered by {out['chosen']}; "
          f"paired differences mean {min(d_mean):+.2f}..{max(d_mean):+.2f}, p99 "
          f"{min(d_p99):+.2f}..{max(d_p99):+.2f})")
    return out
