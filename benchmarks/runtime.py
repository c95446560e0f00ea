"""The on-device runtime on a real bundle: end-to-end (what the app waits) vs invoke latency per
width, predict_batch throughput vs looping predict, width-switch time, a budget trace judged on
end-to-end time, and cascade vs always-full.

    python benchmarks/runtime.py --bundle runs/demo/bundle [--data npz:DIR/fashion_mnist.npz]

Without --data the trace feeds random inputs in the raw range (no accuracy); with it, the
source's test split (trainer.data, torch). Everything else is torch-free. 1 thread throughout.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

import edge_sdk


def med_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def latency_table(model, configs, x, repeats: int) -> dict[str, float]:
    """Per configuration: bare invoke, set+invoke+get, and predict() timed from outside, with
    the latency_ms / invoke_ms it reports; interleaved call by call so drift hits all alike.
    Returns each configuration's median end-to-end latency as predict() reports it."""
    print(f"{'config':<14}{'invoke ms':>10}{'s+i+g ms':>9}{'wall ms':>9}{'latency_ms':>11}"
          f"{'invoke_ms':>10}{'SDK us':>8}{'e2e/inv':>8}{'lat/lat(1)':>11}{'MACs/MACs(1)':>13}")
    full = max(configs, key=lambda c: (c.width, -c.invokes))
    rows, e2e = {}, {}
    for c in configs:
        interps = model._build(c, plain=True)  # the exported slice's own graph
        xin = model._prepare(x, "x")
        bare, sig, wall, lat, inv = [], [], [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for it, *_ in interps:
                it.invoke()
            t1 = time.perf_counter()
            for it, inp, out, _ in interps:  # what any caller of the interpreter must do
                it.set_tensor(inp, xin)
                it.invoke()
                it.get_tensor(out)
            t2 = time.perf_counter()
            p = model.predict(x, config_id=c.id)
            t3 = time.perf_counter()
            bare.append(t1 - t0)
            sig.append(t2 - t1)
            wall.append(t3 - t2)
            lat.append(p.latency_ms / 1e3)
            inv.append(p.invoke_ms / 1e3)
        rows[c.id] = [med_ms(v) for v in (bare, sig, wall, lat, inv)]
        e2e[c.id] = rows[c.id][3]
    for c in configs:
        b, s, w, lt, iv = rows[c.id]
        print(f"{c.id:<14}{b:>10.4f}{s:>9.4f}{w:>9.4f}{lt:>11.4f}{iv:>10.4f}"
              f"{(lt - iv) * 1e3:>8.1f}{lt / iv:>8.2f}{b / rows[full.id][0]:>11.2f}"
              f"{c.macs / full.macs:>13.2f}")
    return e2e


def _budget_for(model, c):
    """A latency budget under which the policy picks ``c``: 3x its predicted end-to-end latency
    (a policy-chosen call also pays the decision; at +25 % a pinned-call estimate sat so close
    that the policy's own calls drifted over it and every call took the "nothing fits" path),
    but 10 % below every better-ranked configuration's prediction, so none of them fits: the
    policy-chosen calls of :func:`sdk_table`. None when no such budget leaves ``c`` 20 % +
    20 us over its own prediction (a better-ranked configuration predicted about as fast,
    or faster): then the policy's calls would take the "nothing fits" path whenever one ran
    slow (measured: a budget 12 us over a digits head's pinned latency, its policy-chosen
    calls 14 us over it), timing the decision's slow path rather than a call the policy
    would make."""
    pol = model.policy
    order = pol.candidates  # what may answer: a precision variant not answering now, never
    if c not in order:
        return None
    own = pol.predicted_latency_ms(c)
    better = [pol.predicted_latency_ms(o) for o in order[:order.index(c)]]
    budget = min(3 * own, 0.9 * min(better, default=math.inf))
    return edge_sdk.Budget(latency_ms=budget) if budget >= 1.2 * own + 0.02 else None


def loop_sdk_us(model, c, x, calls: int, budget=None) -> float:
    """The pinned call in a tight loop, what an app calling ``predict`` back to back sees: per
    call its wall time minus the time of the interpreter's ``invoke()`` calls inside it (a
    shim on this model's interpreters times them; the shim's own ~0.2 us counts as the SDK's),
    median over ``calls``. Paired within each call, so the host's drift cancels. With
    ``budget``: the policy-chosen call under it instead (:func:`_budget_for`), counted only
    when the policy chose ``c`` (nan if it chose another configuration on most calls)."""
    model.predict(x, config_id=c.id)  # resident at batch 1
    interps = [i[0] for i in model._interpreters(c)]
    pc = time.perf_counter
    inside: list[float] = []

    def shim(it):
        invoke = it.invoke  # the compiled wrapper's own (edge_sdk.backends), or the class'

        def timed() -> None:
            t0 = pc()
            invoke()
            inside.append(pc() - t0)
        return timed

    saved = [it.__dict__.get("invoke") for it in interps]
    for it in interps:
        it.invoke = shim(it)  # an instance attribute: the SDK's it.invoke() calls it
    sdk = []
    other = 0
    pin = c.id if budget is None else None  # predict(x, None, config_id=...) is the pinned call
    try:
        for _ in range(calls):
            k = len(inside)
            t0 = pc()
            p = model.predict(x, budget, config_id=pin)
            t = pc() - t0 - sum(inside[k:])
            if p.config_id == c.id:
                sdk.append(t)
            else:
                other += 1
    finally:
        for it, real in zip(interps, saved):
            if real is None:
                del it.invoke
            else:
                it.invoke = real
    if other > calls // 2:
        return math.nan
    return statistics.median(sdk) * 1e6


def sdk_table(bundle: str, configs, x, calls: int, threads: int = 1) -> list[dict]:
    """The SDK's own time per call (issue 34 goal 5): per configuration, interleaved call by
    call, each round in a random order, so the machine's drift and the caches' state hit all
    alike, the median over ``calls`` of
    raw invoke (the interpreter's ``invoke()`` alone, what ``edge-sdk bench`` subtracts),
    raw set+invoke+get (what any caller of the interpreter must do), ``predict`` pinned
    (``config_id``) and policy-chosen (under :func:`_budget_for`'s budget; 'by' names who
    answered, 'no room' when no budget separates it from a better-ranked configuration), with the
    uncertainty fields and the input check off (``load(uncertainty=False,
    input_check=False)``) and on (when the bundle has them). Each timed from outside
    (perf_counter around the one call). SDK µs = median predict - median raw invoke, the raw
    invoke of the slice the exporter wrote (so the answer's softmax the runtime appends to
    the graph, edge_sdk.answers.graph, counts as the SDK's time). 'loop us': the pinned call
    with the fields off in a tight loop instead (:func:`loop_sdk_us`), 'loop pol' the
    policy-chosen one: interleaved, every call starts from caches the other models' calls
    left (what an app that does other work between calls sees); back to back, from its own."""
    off = edge_sdk.load(bundle, threads=threads, uncertainty=False, input_check=False)
    on = edge_sdk.load(bundle, threads=threads) if off.manifest.uncertainty is not None \
        or off.manifest.input_stats is not None else None
    models = [("off", off)] + ([("on", on)] if on is not None else [])
    print(f"median of {calls} calls each, interleaved; {threads} thread(s); input "
          f"{off.input_spec.dtype} {list(off.input_spec.shape[1:])}; uncertainty fields "
          f"{'off / on' if on is not None else 'off (the bundle has none)'}")
    head = f"{'config':<14}{'invoke':>8}{'s+i+g':>8}"
    for u, _ in models:
        head += f"{'pin ' + u:>9}{'SDK us':>8}{'pol ' + u:>9}{'SDK us':>8}{'by':>14}"
    print(head + f"{'loop us':>9}{'loop pol':>9}   (ms unless us)")
    rows = []
    for c in configs:
        # private interpreters of the exported slice's own graph (without the answer's
        # softmax, edge_sdk.answers.graph: its cost counts as the SDK's)
        raw = off._build(c, plain=True)
        xin = off._prepare(x, "x")
        budgets = {u: _budget_for(m, c) for u, m in models}
        for u, m in models:  # first use, and a few calls for the policy's estimates
            for _ in range(50):
                m.predict(x, config_id=c.id)
            budgets[u] = _budget_for(m, c)
            for _ in range(20 if budgets[u] is not None else 0):
                m.predict(x, budgets[u])
        t = {k: [] for k in ["invoke", "sig"] + [f"{k}{u}" for u, _ in models
                                                 for k in ("pin", "pol")]}
        who: dict[str, dict[str, int]] = {u: {} for u, _ in models}
        clock = time.perf_counter

        def invoke() -> None:
            for it, *_ in raw:
                it.invoke()

        def sig() -> None:
            for it, inp, out, _ in raw:
                it.set_tensor(inp, xin)
                it.invoke()
                it.get_tensor(out)

        def pinned(m):
            return lambda: m.predict(x, config_id=c.id)

        def chosen(m, budget, counts):
            def run() -> None:
                p = m.predict(x, budget)
                counts[p.config_id] = counts.get(p.config_id, 0) + 1
            return run

        runs = [("invoke", invoke), ("sig", sig)]
        for u, m in models:
            runs.append((f"pin{u}", pinned(m)))
            if budgets[u] is not None:
                runs.append((f"pol{u}", chosen(m, budgets[u], who[u])))
        order = np.random.default_rng(0)
        for _ in range(calls):
            # each round in a random order: what ran just before each call (and what it left
            # in the caches: the on model's OOD bank, another copy's weights) varies alike
            # for all, instead of the raw invoke always following the heaviest call
            for k in order.permutation(len(runs)):
                key, fn = runs[k]
                t0 = clock()
                fn()
                t[key].append(clock() - t0)
        med = {k: med_ms(v) if v else math.nan for k, v in t.items()}
        row = {"config": c.id, "scope": c.scope, "invoke_ms": med["invoke"],
               "set_invoke_get_ms": med["sig"]}
        line = f"{c.id:<14}{med['invoke']:>8.4f}{med['sig']:>8.4f}"
        for u, _ in models:
            by = max(who[u], key=who[u].get) if who[u] else "no room"
            share = who[u][by] / calls if who[u] else 1.0
            for k in ("pin", "pol"):
                row[f"{k}_{u}_ms"] = med[f"{k}{u}"]
                row[f"{k}_{u}_sdk_us"] = (med[f"{k}{u}"] - med["invoke"]) * 1e3
            row[f"pol_{u}_by"] = by
            line += (f"{med['pin' + u]:>9.4f}{row[f'pin_{u}_sdk_us']:>8.1f}"
                     f"{med['pol' + u]:>9.4f}{row[f'pol_{u}_sdk_us']:>8.1f}"
                     f"{by + ('' if share > 0.99 else f' {share:.0%}'):>14}")
        row["loop_off_sdk_us"] = loop_sdk_us(off, c, x, calls)
        row["loop_pol_off_sdk_us"] = math.nan if budgets["off"] is None else \
            loop_sdk_us(off, c, x, calls, budgets["off"])
        line += f"{row['loop_off_sdk_us']:>9.1f}{row['loop_pol_off_sdk_us']:>9.1f}"
        print(line, flush=True)
        rows.append(row)
    return rows


def batch_table(bundle: str, configs, ns: list[int], repeats: int) -> None:
    """Samples/s of predict_batch(N) vs N looped predict() calls vs a raw batched invoke (the
    interpreter alone at batch N: set + invoke + get), per configuration, 1 thread;
    predict_batch with every field on (the default load) and with the uncertainty fields and
    the input check off. Separate models for each, so none pays for resizing another's
    interpreters. ``t/raw``: predict_batch's median time over the raw invoke's (issue 34
    asks <= 1.1 at N = 64), the four interleaved call by call in a random order; 'b2b off':
    the same ratio with the fields off, each called back to back (alternated runs of 50)."""
    loop_m = edge_sdk.load(bundle, threads=1)
    batch_m = edge_sdk.load(bundle, threads=1)
    off_m = edge_sdk.load(bundle, threads=1, uncertainty=False, input_check=False)
    spec = loop_m.input_spec
    lo, hi = spec.value_range
    xs = np.random.default_rng(1).uniform(lo, hi, (max(ns), *spec.shape[1:])).astype(spec.dtype)
    resizable = batch_m.manifest.batch_resizable
    print(f"batch dimension resizable: {resizable} (schema {batch_m.manifest.schema_version}); "
          f"median of {repeats} rounds, samples/s; 'raw' = the interpreter's batched invoke "
          f"alone (set + invoke + get); on / off = the uncertainty fields and input check")
    print(f"{'config':<14}{'N':>4}{'loop/s':>10}{'on/s':>10}{'off/s':>10}{'raw/s':>10}"
          f"{'on/loop':>9}{'t on/raw':>9}{'t off/raw':>10}{'b2b off':>9}")
    for c in configs:
        for n in ns:
            xb = xs[:n]
            # a private interpreter of the exported graph, resized like predict_batch's
            raw = batch_m._build(c, plain=True)
            xin = np.stack([batch_m._prepare(x)[0] for x in xb])
            for it, inp, *_ in raw:
                if n > 1 and resizable:
                    it.resize_tensor_input(inp, [n, *spec.shape[1:]])
                    it.allocate_tensors()
            for _ in range(3):  # warm: interpreters built, resized, measured
                batch_m.predict_batch(xb, config_id=c.id)
                off_m.predict_batch(xb, config_id=c.id)
                for x in xb:
                    loop_m.predict(x, config_id=c.id)

            def loop() -> None:
                for x in xb:
                    loop_m.predict(x, config_id=c.id)

            def raw_batch() -> None:
                for it, inp, out, _ in raw:
                    if n > 1 and resizable:
                        it.set_tensor(inp, xin)
                        it.invoke()
                        it.get_tensor(out)
                    else:
                        for i in range(n):
                            it.set_tensor(inp, xin[i:i + 1])
                            it.invoke()
                            it.get_tensor(out)

            def off_batch() -> None:
                off_m.predict_batch(xb, config_id=c.id)

            runs = [(loop, []), (lambda: batch_m.predict_batch(xb, config_id=c.id), []),
                    (off_batch, []), (raw_batch, [])]
            order = np.random.default_rng(0)
            for _ in range(repeats):
                # each round in a random order: what ran just before each (and what it left in
                # the caches: the on model's OOD bank, another copy's weights) varies alike for
                # all four, instead of the raw invoke always following the lightest Python
                for k in order.permutation(len(runs)):
                    fn, times = runs[k]
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
            t_loop, t_batch, t_off, t_raw = (times for _, times in runs)
            sl, sb, so, sr = (n / statistics.median(t) for t in (t_loop, t_batch, t_off, t_raw))
            # back to back: the fields-off predict_batch and the raw batch each in runs of
            # 50 calls, the runs alternated (drift hits both); each call after the first of a
            # run starts from the caches its own previous call left, as in an app's loop
            b2b: tuple[list[float], list[float]] = ([], [])
            for _ in range(max(repeats // 50, 1)):
                for fn, times in ((off_batch, b2b[0]), (raw_batch, b2b[1])):
                    for _ in range(50):
                        t0 = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - t0)
            ratio = statistics.median(b2b[0]) / statistics.median(b2b[1])
            print(f"{c.id:<14}{n:>4}{sl:>10.0f}{sb:>10.0f}{so:>10.0f}{sr:>10.0f}{sb / sl:>9.2f}"
                  f"{sr / sb:>9.2f}{sr / so:>10.2f}{ratio:>9.2f}", flush=True)


def trace(model, configs, xs, ys, e2e: dict[str, float]) -> None:
    """Budget phases set from the end-to-end latencies measured above; a call is within budget
    when its whole predict() (latency_ms) is. 'rule' = the choice a perfect predictor would
    make: by each configuration's median end-to-end latency over the trace's own unpinned
    calls (the policy's decision included; the pinned figure for one never chosen), and by
    the pinned medians ('rule pinned'), which leave the decision's own time out."""
    def ideal(budget, truth):
        fit = [c for c in configs
               if (budget.latency_ms is None or truth[c.id] <= budget.latency_ms)
               and (budget.memory_mb is None
                    or model.policy.memory_need_mb(c) <= budget.memory_mb)]
        return min(fit, key=model.policy.preference).id if fit else None

    fast, slow = min(e2e.values()), max(e2e.values())
    mems = sorted({model.policy.memory_need_mb(c) for c in configs})
    # the phases of the earlier, invoke-timed trace (same margins), now judged end to end;
    # the 0.1 ms margin leaves room for the policy's own decision, which pinned calls skip
    phases = [("roomy", edge_sdk.Budget(latency_ms=slow * 3)),
              ("tight", edge_sdk.Budget(latency_ms=(fast + slow) / 2 + 0.1)),
              ("tightest", edge_sdk.Budget(latency_ms=fast * 1.5 + 0.1)),
              ("below SDK", edge_sdk.Budget(latency_ms=fast / 2)),
              ("recovered", edge_sdk.Budget(latency_ms=slow * 3)),
              ("memory squeeze", edge_sdk.Budget(memory_mb=mems[len(mems) // 2]))]
    runs = [(name, budget, [model.predict(xi, budget) for xi in xs]) for name, budget in phases]
    seen: dict[str, list[float]] = {}
    for _, _, preds in runs:
        for p in preds:
            seen.setdefault(p.config_id, []).append(p.latency_ms)
    truth = {c.id: statistics.median(seen[c.id]) if c.id in seen else e2e[c.id] for c in configs}
    print(f"{'phase':<16}{'budget':>22}{'rule':>14}{'chosen (most)':>16}{'acc':>7}"
          f"{'e2e ms':>8}{'med ms':>8}{'inv ms':>8}{'met':>7}{'rule':>7}{'pinned':>7}")
    n = met_all = rule_all = pin_all = 0
    for name, budget, preds in runs:
        met = np.mean([p.budget_met for p in preds])
        want = ideal(budget, truth)
        rule = np.mean([p.config_id == want for p in preds])
        pinned = np.mean([p.config_id == ideal(budget, e2e) for p in preds])
        if name != "below SDK":
            n, met_all = n + len(preds), met_all + met * len(preds)
            rule_all, pin_all = rule_all + rule * len(preds), pin_all + pinned * len(preds)
        ids = [p.config_id for p in preds]
        top = max(set(ids), key=ids.count)
        acc = "-" if ys is None else f"{np.mean([p.label == y for p, y in zip(preds, ys)]):.4f}"
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        lat = [p.latency_ms for p in preds]
        print(f"{name:<16}{fmt(budget.latency_ms) + ' ms / ' + fmt(budget.memory_mb) + ' MB':>22}"
              f"{str(want):>14}{top:>16}{acc:>7}{np.mean(lat):>8.4f}{np.median(lat):>8.4f}"
              f"{np.mean([p.invoke_ms for p in preds]):>8.4f}{met:>7.3f}{rule:>7.3f}"
              f"{pinned:>7.3f}")
    print("('below SDK': a budget under the fastest configuration's end-to-end latency, which "
          "no call can meet; excluded from 'all phases')")
    print(f"{'all phases':<16}{'':>22}{'':>14}{'':>16}{'':>7}{'':>8}{'':>8}{'':>8}"
          f"{met_all / n:>7.3f}{rule_all / n:>7.3f}{pin_all / n:>7.3f}   (goals: met >= 0.99, "
          f"rule >= 0.95)")


def cascade(bundle: str, points, full, xs, ys) -> None:
    """Cascade vs always-full, point scope. 'plan': the two-stage cascade fitted at export;
    'climb T': the width climb on the target-accuracy thresholds, for each exported target."""
    full_model = edge_sdk.load(bundle, threads=1)
    full_model.policy.configs = points
    pf = [full_model.predict(xi, config_id=full.id) for xi in xs]
    t_full = np.mean([p.latency_ms for p in pf])
    acc_full = np.mean([p.label == y for p, y in zip(pf, ys)])
    print(f"\ncascade vs always {full.id} (mean end-to-end {t_full:.4f} ms, accuracy "
          f"{acc_full:.4f})")
    print(f"{'cascade':>12}{'mean ms':>9}{'saved':>8}{'accuracy':>10}{'change pt':>10}"
          f"{'answered by':>40}")
    variants = [("plan", 0.95, False)] + [(f"climb {t}", float(t), True)
                                         for t in sorted(full.thresholds, key=float)]
    for label, target, climb in variants:
        casc = edge_sdk.load(bundle, threads=1, policy="cascade", target_accuracy=target)
        casc.policy.configs = points  # point scope only
        casc.policy.climb_only = climb
        if not climb and not any(full.id in c.cascade for c in points):
            print(f"{label:>12}  (this bundle has no cascade plans: re-export it)")
            continue
        pc = [casc.predict(xi) for xi in xs]
        t_c = np.mean([p.latency_ms for p in pc])
        acc_c = np.mean([p.label == y for p, y in zip(pc, ys)])
        who = [p.width for p in pc]
        mix = " ".join(f"{w:g}:{who.count(w) / len(who):.0%}" for w in sorted(set(who)))
        print(f"{label:>12}{t_c:>9.4f}{1 - t_c / t_full:>8.1%}{acc_c:>10.4f}"
              f"{100 * (acc_c - acc_full):>+10.2f}{mix:>40}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--data", default=None, help="source whose test split drives the trace")
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--samples", type=int, default=1000, help="trace/cascade calls per phase")
    p.add_argument("--batch-repeats", type=int, default=60)
    p.add_argument("--batch-sizes", default="1,8,64")
    p.add_argument("--skip", default="", help="comma-separated sections to skip: "
                                              "latency,batch,switch,trace,cascade")
    p.add_argument("--only", default="", help="comma-separated sections to run instead "
                   "(also: sdk, the SDK's own time per call with the uncertainty fields off "
                   "and on, pinned and policy-chosen, which no default run includes; "
                   "monitor, what the device rules add to a call: benchmarks/monitor_cost.py)")
    p.add_argument("--sdk-calls", type=int, default=10000, help="calls per configuration "
                   "and variant in the sdk section (medians)")
    p.add_argument("--config", action="append", default=None, metavar="ID",
                   help="only this configuration (repeatable; the sdk section)")
    p.add_argument("--plain", default=None, help="the same checkpoint exported with "
                   "--no-uncertainty and --other, a model to interleave: the loop section "
                   "(benchmarks/app_loop.py, --only loop)")
    p.add_argument("--other", default=None)
    p.add_argument("--rounds", type=int, default=9, help="alternated rounds (--only monitor)")
    args = p.parse_args()
    if args.only == "monitor":  # what the device rules add to a call
        from edge_sdk.cli.device import bench_input
        from monitor_cost import monitor_table

        spec = edge_sdk.load(args.bundle, threads=1).input_spec
        monitor_table(args.bundle, bench_input(spec), args.rounds, args.sdk_calls)
        return
    if args.only == "loop":  # what an app's loop pays for the answer's fields
        from app_loop import loop_table

        loop_table(args.bundle, args.plain, args.other, args.sdk_calls)
        return
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    if only:
        skip = {"latency", "batch", "switch", "trace", "cascade", "sdk"} - only
    elif "sdk" not in skip:
        skip.add("sdk")
    model = edge_sdk.load(args.bundle, threads=1)
    spec = model.input_spec
    lo, hi = spec.value_range
    x = np.random.default_rng(0).uniform(lo, hi, spec.shape[1:]).astype(spec.dtype)
    configs = model.manifest.configurations
    points = [c for c in configs if c.scope == "point"]
    full = max(points, key=lambda c: c.width)
    print(f"backend {model.backend}; 1 thread; {args.bundle}")
    picked = configs if not args.config else [model._config(cid) for cid in args.config]
    if "sdk" not in skip:
        from edge_sdk.cli.device import bench_input

        print(f"\n== the SDK's own time per call (issue 34), median of {args.sdk_calls}")
        sdk_table(args.bundle, picked, bench_input(spec), args.sdk_calls)

    e2e = None
    if "latency" not in skip:
        print(f"\n== end-to-end vs invoke, batch 1, median of {args.repeats} (latency_ms = the "
              f"whole predict() call as it reports it; wall = timed from outside)")
        e2e = latency_table(model, configs, x, args.repeats)
    if "batch" not in skip:
        print("\n== predict_batch vs looping predict")
        batch_table(args.bundle, [c for c in configs if c.scope in ("point", "head")],
                    [int(n) for n in args.batch_sizes.split(",")], args.batch_repeats)
    if "switch" not in skip:
        a, b = points[0], full
        switch = []
        for i in range(args.repeats):
            p_ = model.predict(x, config_id=(a if i % 2 else b).id)
            switch.append(p_.latency_ms - p_.invoke_ms)
        print(f"\nwidth switch, SDK time per call alternating {a.id} / {b.id}: median "
              f"{statistics.median(switch) * 1e3:.1f} us, p99 {np.percentile(switch, 99) * 1e3:.1f}"
              f" us")
    if args.data is None:
        xs = np.random.default_rng(2).uniform(lo, hi, (args.samples, *spec.shape[1:])) \
            .astype(spec.dtype)  # the declared raw dtype: a uint8 bundle refuses floats
        ys = None
    else:
        from trainer.config import DataConfig
        from trainer.data import load_data

        data = load_data(DataConfig(source=args.data))
        xs, ys = data.test.raw[: args.samples], data.test.y[: args.samples].numpy()
    if "trace" not in skip:
        if e2e is None:
            e2e = {c.id: statistics.median(model.predict(x, config_id=c.id).latency_ms
                                           for _ in range(50)) for c in configs}
        print("\n== budget trace judged on end-to-end time")
        trace(edge_sdk.load(args.bundle, threads=1), configs, xs, ys, e2e)
    if "cascade" not in skip and ys is not None:
        cascade(args.bundle, points, full, xs, ys)


if __name__ == "__main__":
    main()
