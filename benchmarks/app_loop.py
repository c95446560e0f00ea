"""What an app's loop pays for the answer's fields: ``predict`` per point configuration of a
bundle exported with uncertainty, against the same checkpoint exported with
``--no-uncertainty``, back to back and interleaved with another model.

    python benchmarks/app_loop.py --bundle B --plain B_NO_UNC --other OTHER_BUNDLE \
        [--calls 10000] [--block 100]

Models (1 thread each, every call pinned with ``config_id``, timed from outside with
``perf_counter`` around the one call, so the interpreter's own increase counts):

- ``plain``: the ``--no-uncertainty`` export, loaded as an app would (input check on);
- ``off``: the bundle with ``load(uncertainty=False)``;
- ``on``: the bundle as loaded by default, every field on (the app reads label, confidence,
  abstain and in_distribution: what a loop that acts on the verdict touches);
- ``read``: ``on``, and the call also reads ``ood_score``, ``prediction_set`` and ``probs``
  (the lazy fields made).

Modes: ``b2b`` — per round, each model runs ``--block`` calls back to back (the models' order
rotates each round; ``calls / block`` rounds, so the host's drift, which moves a wide float
slice's invoke by 5-10 us over a minute, hits all alike); ``int`` — every timed call follows one
call of ``--other`` (its widest point configuration), so it starts from the caches another
model left (issue 34: what an app doing other work between calls sees). Medians over all
rounds (``calls`` per cell). Only edge_sdk's public API: the same file measures an older tree
(``PYTHONPATH=<worktree> python -S``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import edge_sdk

MODELS = ("plain", "off", "on", "read")


def _reads(p) -> None:
    p.label, p.confidence, p.abstain, p.in_distribution  # noqa: B018 (what a loop touches)


def _reads_all(p) -> None:
    _reads(p)
    p.ood_score, p.prediction_set, p.probs  # noqa: B018


def loop_table(bundle: str, plain: str, other: str, calls: int, block: int = 100,
               modes: tuple[str, ...] = ("b2b", "int"), only: list[str] | None = None
               ) -> list[dict]:
    models = {"plain": edge_sdk.load(plain, threads=1),
              "off": edge_sdk.load(bundle, threads=1, uncertainty=False),
              "on": edge_sdk.load(bundle, threads=1)}
    models["read"] = models["on"]
    touch = {"plain": _reads, "off": _reads, "on": _reads, "read": _reads_all}
    oth = edge_sdk.load(other, threads=1)
    opoint = max((c for c in oth.manifest.configurations if c.scope == "point"),
                 key=lambda c: (c.width, c.id.endswith("-int8")))  # what apps deploy
    ospec = oth.input_spec
    ox = np.random.default_rng(1).uniform(*ospec.value_range, ospec.shape[1:]).astype(ospec.dtype)
    spec = models["on"].input_spec
    x = np.random.default_rng(0).uniform(*spec.value_range, spec.shape[1:]).astype(spec.dtype)
    ids = [c.id for c in models["on"].manifest.configurations if c.scope == "point"
           and (not only or c.id in only)]
    per, rounds = block, max(calls // block, 1)
    clock = time.perf_counter
    print(f"{bundle} vs {plain}; other model {other}: {opoint.id}; median of {per * rounds} "
          f"calls per cell ({rounds} rounds, models rotated), 1 thread, microseconds")
    head = f"{'config':<18}"
    for mode in modes:
        head += "".join(f"{mode + ' ' + m:>11}" for m in MODELS) + f"{mode + ' on-plain':>14}"
    print(head)
    rows = []
    for cid in ids:
        for m in set(models.values()):  # first use, warm estimates
            for _ in range(200):
                m.predict(x, config_id=cid)
        for _ in range(50):
            oth.predict(ox, config_id=opoint.id)
        times: dict[tuple[str, str], list[float]] = {(mo, m): [] for mo in modes for m in MODELS}
        for r in range(rounds):
            order = MODELS[r % len(MODELS):] + MODELS[:r % len(MODELS)]
            for mode in modes:
                for name in order:
                    m, t, out = models[name], touch[name], times[(mode, name)]
                    for _ in range(per):
                        if mode == "int":
                            oth.predict(ox, config_id=opoint.id)
                        t0 = clock()
                        t(m.predict(x, config_id=cid))
                        out.append(clock() - t0)
        row = {"config": cid}
        line = f"{cid:<18}"
        for mode in modes:
            med = {m: statistics.median(times[(mode, m)]) * 1e6 for m in MODELS}
            row.update({f"{mode}_{m}": round(v, 2) for m, v in med.items()})
            row[f"{mode}_on_minus_plain"] = round(med["on"] - med["plain"], 2)
            line += "".join(f"{med[m]:>11.1f}" for m in MODELS) + \
                f"{med['on'] - med['plain']:>+14.1f}"
        print(line, flush=True)
        rows.append(row)
    return rows


def graph_cost(bundle: str, rounds: int = 20, per: int = 300) -> None:
    """The appended score's own cost in the invoke: per point configuration, the runtime's
    graph of the slice with and without the OOD ops (edge_sdk.answers.ood_graph), invoked
    alternately in rounds of ``per``, 1 thread (this tree only: it builds the graphs)."""
    from edge_sdk.answers.graph import runtime_graph

    m = edge_sdk.load(bundle, threads=1)
    spec = m.input_spec
    x = np.random.default_rng(0).uniform(*spec.value_range, spec.shape[1:]).astype(spec.dtype)
    print(f"{bundle}: invoke us, median of {rounds * per} each, alternated")
    print(f"{'config':<18}{'without':>9}{'with':>9}{'+ us':>8}")
    for c in m.manifest.configurations:
        if c.scope != "point" or c.id not in m._unc_width:
            continue
        data, ans = m._slices[c.files[0].name], (c.temperature, 1)
        its = []
        for ood in (None, m.uncertainty.graph_spec(m._unc_width[c.id])):
            it = m._interp_cls(model_content=runtime_graph(data, m._raw, ans, ood=ood),
                               num_threads=1, model_name=c.id)
            it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], x[None])
            for _ in range(200):
                it.invoke()
            its.append(it)
        times: list[list[float]] = [[], []]
        for r in range(rounds):
            for k in ((0, 1) if r % 2 else (1, 0)):
                it = its[k]
                for _ in range(per):
                    t0 = time.perf_counter()
                    it.invoke()
                    times[k].append(time.perf_counter() - t0)
        a, b = (statistics.median(t) * 1e6 for t in times)
        print(f"{c.id:<18}{a:>9.1f}{b:>9.1f}{b - a:>+8.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True, help="exported with uncertainty")
    p.add_argument("--plain", help="the same checkpoint, --no-uncertainty")
    p.add_argument("--other", help="the model interleaved between calls")
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--block", type=int, default=100, help="calls back to back per round")
    p.add_argument("--modes", default="b2b,int")
    p.add_argument("--config", action="append", default=None, help="only these (repeatable)")
    p.add_argument("--graph", action="store_true", help="instead: the appended ops' own cost "
                   "in the invoke (graph_cost; --plain and --other are then ignored)")
    a = p.parse_args()
    if a.graph:
        graph_cost(a.bundle)
        return
    loop_table(a.bundle, a.plain, a.other, a.calls, a.block,
               tuple(m for m in a.modes.split(",") if m), a.config)


if __name__ == "__main__":
    main()
