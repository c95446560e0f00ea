"""Issue 36's figures: the hostile-bundle sweep (>= 2,000 cases) and the cost of refusing a
zlib bomb. Prints tables; asserts nothing (the promise itself is tested by
tests/edge_sdk/test_fuzz_corpus.py in CI).

    .venv/bin/python benchmarks/fuzz.py --bundle /tmp/edge_test_bundle            # the sweep
    .venv/bin/python benchmarks/fuzz.py --bundle ... --byte-cases 100 --unchecked  # without
        # the graph check (edge_sdk.tflite.reader), to see what it prevents

1. The sweep: tests/edge_sdk/fuzz_corpus.py's classes with ``--byte-cases`` byte-fuzzed slices
   (default 1,800: ~2,100 cases in all) and another seed than CI's; each case in a forked
   child; the table is class -> cases -> refused / answered / crash / raw / nan.
2. The bomb: a ~1 MB ``store.bin`` declaring 1 GiB inflated, in a store bundle whose manifest
   lists its sha256 (so it reaches the decoder), loaded in a fresh child per repeat: the time
   of ``load()`` until its BundleError and the peak RSS increase over the child's RSS before
   it (Linux's VmHWM, reset through /proc/self/clear_refs). Median of the repeats. The same for
   a stream within the ratio cap whose inflated bytes are garbage (8 MiB declared).

Needs an exported files bundle (``--bundle``, default ``$EDGE_SDK_TEST_BUNDLE``), Linux (fork,
/proc); no torch.
"""
from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "edge_sdk"))
import fuzz_corpus as fc  # noqa: E402


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure_refusal(directory: Path) -> tuple[float, float, str]:
    """(ms until load() refused, peak RSS increase in MB, the error) in a fresh child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            import edge_sdk
            import edge_sdk.runtime.model  # noqa: F401 - imports are not part of the refusal
            import edge_sdk.store  # noqa: F401
            from edge_sdk.errors import EdgeSdkError

            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            before = _rss_kb()
            t0 = time.perf_counter()
            try:
                edge_sdk.load(directory, profile=None)
                err = "loaded (not refused)"
            except EdgeSdkError as exc:
                err = f"{type(exc).__name__}: {str(exc)[:160]}"
            ms = (time.perf_counter() - t0) * 1000
            os.write(w, pickle.dumps((ms, (_hwm_kb() - before) / 1024, err)))
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return pickle.loads(data)


def bombs(bundle: Path, repeats: int, work: Path) -> None:
    data, blob, name = fc.base_bundle(bundle)
    cases = {c.name: c for c in fc.store_cases(data, name, blob)}
    print(f"\nRefusing hostile stores: load() until its BundleError, in a fresh child per "
          f"repeat (median of {repeats})")
    print(f"{'store.bin':<44} {'bytes':>9} {'ms':>8} {'peak RSS +MB':>13}  refusal")
    for label in ("1 MB stream declaring 1 GiB (zlib bomb)", "plausible ratio, garbage inside",
                  "header nested 200,000 deep"):
        case = cases[label]
        d = fc.write_case(case.files, work / "bomb")
        runs = [measure_refusal(d) for _ in range(repeats)]
        ms = statistics.median(r[0] for r in runs)
        mb = statistics.median(r[1] for r in runs)
        size = len(case.files["store.bin"])
        print(f"{label:<44} {size:>9} {ms:>8.2f} {mb:>13.2f}  {runs[0][2][:90]}")


def sweep(bundle: Path, byte_cases: int, seed: int, work: Path, unchecked: bool) -> None:
    cases = fc.corpus(bundle, byte_cases=byte_cases, seed=seed)
    if unchecked:
        # what the graph check prevents: slices go to the interpreter with only the old
        # checks (sha256, I/O tensors), as before issue 36; the children inherit the patch
        import edge_sdk.bundle.slices as slices

        slices.read_graph = lambda data, what: None
        cases = [c for c in cases if c.cls in ("byte-fuzz", "shape-patch", "alloc", "audit")]
    t0 = time.perf_counter()
    done = [0]

    def progress(i: int) -> None:
        done[0] = i + 1
        if (i + 1) % 250 == 0:
            print(f"  {i + 1}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)

    results = fc.run_corpus(cases, work / "sweep", progress)
    spent = time.perf_counter() - t0
    print(f"\nHostile-bundle sweep{' WITHOUT the graph check' if unchecked else ''}: "
          f"{len(cases)} cases (seed {seed}), each in a forked child, {spent:.0f} s "
          f"({spent / len(cases) * 1000:.0f} ms per case)")
    print(fc.format_table(fc.table(results)))
    bad = [r for r in results if r.outcome in ("crash", "raw", "nan")]
    for r in bad[:30]:
        print(f"  {r.case.cls} | {r.case.name} | {r.outcome} | {r.detail[:160]}")
    kinds: dict[str, int] = {}
    for r in results:
        if r.outcome == "refused":
            k = r.detail.split(":")[0]
            kinds[k] = kinds.get(k, 0) + 1
    print("refusals by type: " + ", ".join(f"{k} {v}" for k, v in
                                           sorted(kinds.items(), key=lambda kv: -kv[1])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", default=os.environ.get("EDGE_SDK_TEST_BUNDLE"),
                   help="an exported files bundle (default: $EDGE_SDK_TEST_BUNDLE)")
    p.add_argument("--byte-cases", type=int, default=1800)
    p.add_argument("--seed", type=int, default=2036, help="CI's corpus uses 36")
    p.add_argument("--repeats", type=int, default=5, help="bomb refusals measured")
    p.add_argument("--unchecked", action="store_true",
                   help="disable the graph check (shows what it prevents)")
    p.add_argument("--skip-sweep", action="store_true")
    args = p.parse_args(argv)
    if not args.bundle or not (Path(args.bundle) / "manifest.yaml").is_file():
        p.error("--bundle must name an exported bundle (or set EDGE_SDK_TEST_BUNDLE)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.unchecked:
            bombs(Path(args.bundle), args.repeats, work)
        if not args.skip_sweep:
            sweep(Path(args.bundle), args.byte_cases, args.seed, work, args.unchecked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
