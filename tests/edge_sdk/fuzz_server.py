"""The fork server of issue 36's hostile-bundle corpus (tests/edge_sdk/fuzz_corpus.py): what a
case is, how a child runs it and reports, and the class -> outcome table.

A child process runs each case (``os.fork`` of a server that imported everything once) and
reports one outcome: ``refused`` (an EdgeSdkError subclass), ``answered`` (finite
probabilities summing to 1, the label their argmax), ``nan`` (an answer with NaN or inf, or
malformed), ``raw`` (any other exception) or ``crash`` (killed by a signal, or no answer within
the time limit). Linux / macOS (fork); numpy + pyyaml; no torch.
"""
from __future__ import annotations

import hashlib
import math
import os
import pickle
import select
import shutil
import signal
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from edge_sdk.bundle import MANIFEST_NAME

OUTCOMES = ("refused", "answered", "crash", "raw", "nan")
TIME_LIMIT_S = 30.0  # a hang guard per case, not a timing assertion


@dataclass
class Case:
    cls: str
    name: str
    # (work directory) -> what the child runs: a callable returning the outcome details
    run: Callable[[Path], object]
    files: dict[str, bytes] = field(default_factory=dict)



# ------------------------------------------------------------------------ writing a case
def _manifest_text(data: dict) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def _with_slice(data: dict, name: str, blob: bytes) -> dict[str, bytes]:
    """The bundle's files with ``blob`` as the slice, its sha256 and size in the manifest."""
    d = pickle.loads(pickle.dumps(data))
    f = d["configurations"][0]["files"][0]
    f["sha256"], f["bytes"] = hashlib.sha256(blob).hexdigest(), len(blob)
    return {MANIFEST_NAME: _manifest_text(d), name: blob}


def write_case(files: dict[str, bytes], directory: Path) -> Path:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for n, b in files.items():
        (directory / n).write_bytes(b)
    return directory


# ----------------------------------------------------------------------- what a child runs
def _x(manifest: dict, seed: int = 0) -> np.ndarray:
    spec = manifest["input"]
    lo, hi = spec["value_range"]
    shape = spec["shape"][1:]
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def load_and_predict(directory: Path, x: np.ndarray, **load_kwargs) -> list:
    """What an app does: load, then one predict and one batch of two."""
    import edge_sdk

    model = edge_sdk.load(directory, profile=None, **load_kwargs)
    answers = [model.predict(x)]
    answers += model.predict_batch(np.stack([x, x[::-1].copy()]))
    return answers


def classify(answers: list, classes: int) -> str:
    for p in answers:
        probs = np.asarray(p.probs, np.float64)
        if not (np.isfinite(probs).all() and math.isfinite(p.confidence)
                and math.isfinite(p.entropy) and math.isfinite(p.mutual_info)):
            return "nan"
        if (len(probs) != classes or abs(probs.sum() - 1) > 1e-4 or (probs < 0).any()
                or p.label != int(probs.argmax()) or p.confidence != probs[p.label]):
            return "nan"  # a malformed answer counts with the NaN ones: never silent
    return "answered"


# ----------------------------------------------------------------------------- the server
@dataclass
class Result:
    case: Case
    outcome: str
    detail: str


def _child(case: Case, directory: Path, w: int) -> None:
    """In the forked child: run the case, write one pickled (outcome, detail), exit."""
    from edge_sdk.errors import EdgeSdkError

    try:
        outcome = case.run(directory)
        detail = ""
    except EdgeSdkError as exc:
        outcome, detail = "refused", f"{type(exc).__name__}: {str(exc)[:300]}"
    except BaseException as exc:  # noqa: BLE001 - what the corpus exists to find
        outcome = "raw"
        detail = f"{type(exc).__name__}: {str(exc)[:200]} | " + \
            " ".join(traceback.format_exc().splitlines()[-4:])[:400]
    os.write(w, pickle.dumps((outcome, detail)))
    os._exit(0)


def run_case(case: Case, work: Path, limit_s: float = TIME_LIMIT_S) -> Result:
    directory = write_case(case.files, work / "case") if case.files else work
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        import faulthandler

        faulthandler.disable()  # pytest's would print a traceback for every expected crash
        try:
            _child(case, directory, w)
        finally:
            os._exit(70)
    os.close(w)
    chunks, deadline = [], time.monotonic() + limit_s
    while True:
        ready, _, _ = select.select([r], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return Result(case, "crash", f"no answer within {limit_s:g} s (killed)")
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return Result(case, "crash", f"killed by signal {signal.Signals(sig).name}")
    try:
        outcome, detail = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - no report: the child died without one
        return Result(case, "crash", f"exit status {os.WEXITSTATUS(status)}, no report")
    return Result(case, outcome, detail)


def run_corpus(cases: list[Case], work: Path, progress: Callable[[int], None] | None = None
               ) -> list[Result]:
    """Every case in its own forked child, one after another (this process imports the
    runtime and the interpreter once, so a child costs a fork, not an interpreter start)."""
    import edge_sdk.backends as backends
    import edge_sdk.runtime.model  # noqa: F401 - imported once, before the forks

    backends.interpreter_class()  # the backend module imported, its banner spent once
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for i, c in enumerate(cases):
        out.append(run_case(c, work))
        if progress is not None:
            progress(i)
    return out


def table(results: list[Result]) -> dict[str, Counter]:
    """class -> Counter of outcomes (plus "cases")."""
    t: dict[str, Counter] = {}
    for r in results:
        c = t.setdefault(r.case.cls, Counter())
        c["cases"] += 1
        c[r.outcome] += 1
    return t


def format_table(t: dict[str, Counter]) -> str:
    rows = [f"{'class':<12} {'cases':>6} " + " ".join(f"{o:>8}" for o in OUTCOMES)]
    total = Counter()
    for cls, c in t.items():
        total.update(c)
        rows.append(f"{cls:<12} {c['cases']:>6} " + " ".join(f"{c[o]:>8}" for o in OUTCOMES))
    rows.append(f"{'total':<12} {total['cases']:>6} "
                + " ".join(f"{total[o]:>8}" for o in OUTCOMES))
    return "\n".join(rows)


# ------------------------------------------------------------- a clean process to fork from
def run_in_clean_process(bundle: Path, work: Path, byte_cases: int = 400, seed: int = 36,
                         timeout_s: float = 1800.0) -> list[Result]:
    """The corpus run by a fresh interpreter (``python fuzz_server.py``) that forks every case
    from itself: the test process may hold threads (torch's pools, in the full test run),
    pytest's faulthandler and whatever else was imported, none of which a forked child should
    inherit. Results come back as JSON."""
    import json
    import subprocess
    import sys

    out = work / "results.json"
    work.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    proc = subprocess.run(
        [sys.executable, str(here / "fuzz_server.py"), str(bundle), str(work), str(out),
         str(byte_cases), str(seed)], cwd=work, capture_output=True, text=True,
        timeout=timeout_s)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"the corpus process failed (exit {proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return [Result(Case(cls, name, _no_run), outcome, detail)
            for cls, name, outcome, detail in json.loads(out.read_text())]


def _no_run(directory: Path) -> object:
    raise RuntimeError("a case read back from JSON does not run again")


def _main(argv: list[str]) -> int:
    import json

    from fuzz_corpus import corpus

    bundle, work, out, byte_cases, seed = argv
    results = run_corpus(corpus(Path(bundle), byte_cases=int(byte_cases), seed=int(seed)),
                         Path(work) / "cases")
    Path(out).write_text(json.dumps([[r.case.cls, r.case.name, r.outcome, r.detail]
                                     for r in results]))
    return 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(_main(sys.argv[1:]))
