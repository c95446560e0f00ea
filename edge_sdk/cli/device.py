"""Device-side subcommands (``edge-sdk run``, ``bench``, ``profile``, ``materialize``): numpy +
the interpreter (+ flatbuffers for materialising) only, never torch."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError
from edge_sdk.inputs.files import read_input

if TYPE_CHECKING:
    from edge_sdk.answers.prediction import Prediction
    from edge_sdk.bundle.input_spec import InputSpec
    from edge_sdk.runtime.model import EdgeModel


def _read_input(path: str, spec: InputSpec, resize: bool = False) -> npt.NDArray[Any]:
    return read_input(path, spec, resize)


def _is_batch(x: npt.NDArray[Any], spec: InputSpec) -> bool:
    """Whether an ``--input`` array is a batch, decided from the bundle's input spec
    ``[1, H, W, C]``: ``[N, H, W, C]`` is; for a grey model (C = 1) so is ``[N, H, W]``, while
    ``[H, W]`` and ``[H, W, 1]`` are one sample. Anything else goes to ``predict`` as one
    sample, whose shape error names the forms it accepts."""
    _, h, w, c = spec.shape
    if x.ndim == 4:
        return True
    return c == 1 and x.ndim == 3 and x.shape != (h, w, 1) and x.shape[1:] == (h, w)


EXIT_CODES = """exit codes:
  0  every prediction answered (within its budget, or without --strict)
  2  invalid input: arguments, the input file, the bundle, or a malformed budget
  3  --strict: a valid budget that could not be met (nothing predicted to fit, or an answer
     that came in over the budget; its line is still printed)"""


def run_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="edge-sdk run", epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Predict with a bundle under a budget.")
    p.add_argument("bundle")
    p.add_argument("--input", required=True,
                   help=".npy: one sample [H, W, C] or a batch [N, H, W, C] (a grey model also "
                        "takes [H, W] and [N, H, W]); or an image of the model's size (of any "
                        "size, and a uint8 .npy photo too, for a bundle that records its photo "
                        "transform)")
    p.add_argument("--resize", action="store_true",
                   help="resize an image of another size and convert its channels (else an "
                        "image must match the model's input); a bundle that records its photo "
                        "transform resizes and crops by it, and ignores this")
    p.add_argument("--latency-ms", type=float, default=None,
                   help="end-to-end latency budget per call (a batch: per batch)")
    p.add_argument("--memory-mb", type=float, default=None)
    p.add_argument("--policy", choices=["best", "cascade"], default="best")
    p.add_argument("--target-accuracy", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", default="auto",
                   help="latency priors: auto (the cached measured profile, else the "
                        "manifest), a built-in device profile name, a profile YAML, or none")
    p.add_argument("--strict", action="store_true",
                   help="refuse (exit 3) instead of answering outside the budget")
    p.add_argument("--explain", action="store_true",
                   help="print the decision table (why this configuration) before answering")
    p.add_argument("--json", action="store_true", help="one JSON object per prediction")
    p.add_argument("--trusted-key", action="append", default=None, metavar="PUBLIC_PEM",
                   help="load only a bundle signed by this Ed25519 public key (repeatable; "
                        "docs/signing.md)")
    args = p.parse_args(argv)
    from edge_sdk.policy.budget import Budget
    from edge_sdk.runtime.loading import load

    budget = Budget(args.latency_ms, args.memory_mb)  # malformed: BudgetError, exit 2
    profile = None if args.profile.lower() == "none" else args.profile
    model = load(args.bundle, profile=profile, threads=args.threads,
                          policy=args.policy, target_accuracy=args.target_accuracy,
                          strict=args.strict, trusted_keys=args.trusted_key)
    x = _read_input(args.input, model.input_spec, args.resize)
    batch = _is_batch(x, model.input_spec)
    if args.explain:
        exp = model.explain(budget, len(x) if batch else 1)
        print(json.dumps({"explain": exp.to_dict()}) if args.json else f"{exp}\n")
    # the configuration's first use (interpreter creation + first invoke) is start-up, like
    # load(): paid before the timed call, so latency_ms is what a running app would see
    model.warm_up(budget)
    preds = model.predict_batch(x, budget) if batch else [model.predict(x, budget)]
    for pr in preds:
        print(json.dumps(pr.to_dict()) if args.json else plain_line(pr, model))
    if args.strict and not all(pr.budget_met for pr in preds):
        print("error: the budget was not met (strict mode)", file=sys.stderr)
        return 3
    return 0


def plain_line(p: Prediction, model: EdgeModel) -> str:
    """One answer as ``edge-sdk run`` prints it without --json, tab-separated: what --json
    holds that a reader acts on. The class and its confidence; the mutual information only
    where the configuration samples (a point network's is 0 by construction, so printing it
    said nothing); ``ok`` or ``ABSTAIN`` with why (the confidence below the threshold for
    the target accuracy, out of distribution, the raw input suspect); the OOD score and
    flag; the prediction set (class names); ``INPUT SUSPECT`` when it is; then who
    answered, the time and the budget."""
    out = [p.class_name, f"confidence {p.confidence:.4f}"]
    if p.samples > 1:
        out.append(f"MI {p.mutual_info:.5f}")
    why = abstain_reasons(p, model) if p.abstain else []
    out.append("ok" if not p.abstain else f"ABSTAIN ({'; '.join(why)})" if why else "ABSTAIN")
    if p.ood_score is not None:
        out.append(f"ood {p.ood_score:.4f} " + ("in distribution" if p.in_distribution
                                                 else "OUT OF DISTRIBUTION"))
    if p.prediction_set is not None:
        names = model.manifest.labels
        out.append("set {" + ", ".join(names[i] for i in p.prediction_set) + "}")
    if p.input_suspect:
        out.append("INPUT SUSPECT (raw statistics unlike the training data's)")
    out += [p.config_id, f"{p.latency_ms:.3f} ms (invoke {p.invoke_ms:.3f})",
            f"budget {'met' if p.budget_met else 'MISSED'}"]
    return "\t".join(out)


def abstain_reasons(p: Prediction, model: EdgeModel) -> list[str]:
    """Why ``p`` abstained, by the rule that made it (edge_sdk.answers.prediction.abstains):
    its confidence below the threshold the bundle exported for the target accuracy (or no
    threshold reaching it), and with ``abstain_on_ood`` the input out of distribution or its
    raw statistics suspect."""
    target = f"{model.target_accuracy:g}"
    threshold = model.manifest.configuration(p.config_id).thresholds.get(target)
    why = []
    if threshold is None:
        why.append(f"no confidence reaches target accuracy {target}")
    elif p.confidence < threshold:
        why.append(f"low confidence: below {threshold:g} for target accuracy {target}")
    if model.abstain_on_ood and p.in_distribution is False:
        why.append("out of distribution")
    if model.abstain_on_ood and p.input_suspect:
        why.append("input suspect")
    return why


def bench_input(spec: InputSpec, seed: int = 0) -> npt.NDArray[Any]:
    """One sample of what ``predict`` accepts for this input spec: the declared dtype (uint8
    bundles take integers, float bundles float32) drawn uniformly over the declared value
    range, shape ``input.shape[1:]``."""
    rng = np.random.default_rng(seed)
    lo, hi = spec.value_range
    shape = tuple(spec.shape[1:])
    if np.dtype(spec.dtype).kind in "iu":
        return rng.integers(int(np.ceil(lo)), int(np.floor(hi)) + 1, shape).astype(spec.dtype)
    return rng.uniform(lo, hi, shape).astype(spec.dtype)


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="edge-sdk bench",
                                description="Per-configuration latency of predict() against raw "
                                            "interpreter invoke() (median, batch 1), on an input "
                                            "of the bundle's declared dtype and value range.")
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--config", action="append", default=None, metavar="ID",
                   help="measure only this configuration (repeatable; default: every one)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (the run, and one row per configuration) instead of "
                        "the table")
    p.add_argument("--trusted-key", action="append", default=None, metavar="PUBLIC_PEM",
                   help="load only a bundle signed by this Ed25519 public key (repeatable)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    from edge_sdk.runtime.loading import load

    model = load(args.bundle, threads=args.threads, trusted_keys=args.trusted_key)
    spec = model.input_spec
    x = bench_input(spec)
    configs = list(model.manifest.configurations)
    if args.config:
        known = {c.id: c for c in configs}
        unknown = [cid for cid in args.config if cid not in known]
        if unknown:
            raise ConfigError(f"--config {unknown[0]!r} is not a configuration of this bundle; "
                              f"it has {', '.join(known)}")
        configs = [known[cid] for cid in args.config]
    rows = []
    if not args.json:
        print(f"backend {model.backend}, {args.threads} thread(s), {args.repeats} repeats, "
              f"input {spec.dtype} {list(spec.shape[1:])}")
        print(f"{'configuration':<16}{'invoke ms':>10}{'predict ms':>11}{'overhead us':>12}"
              f"{'ratio':>7}{'manifest MB':>12}")
    for c in configs:
        # the exported slice's own graph: the answer's softmax appended at load
        # (edge_sdk.answers.graph) counts as the SDK's time
        interps = model._build(c, plain=True)
        xin = model._prepare(x, "x")
        for it, inp, *_ in interps:
            it.set_tensor(inp, xin)
        model.predict(x, config_id=c.id)  # first use paid before the timed calls
        raw, full = [], []
        for _ in range(args.repeats):  # interleaved, so drift hits both
            t0 = time.perf_counter()
            for it, *_ in interps:
                it.invoke()
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.predict(x, config_id=c.id)
            full.append(time.perf_counter() - t0)
        r, f = statistics.median(raw) * 1e3, statistics.median(full) * 1e3
        row = {"config": c.id, "invoke_ms": round(r, 5), "predict_ms": round(f, 5),
               "overhead_us": round((f - r) * 1e3, 2), "ratio": round(f / r, 3),
               "memory_mb": c.memory_mb}
        rows.append(row)
        if not args.json:
            mb = "-" if c.memory_mb is None else f"{c.memory_mb:.1f}"
            print(f"{c.id:<16}{r:>10.3f}{f:>11.3f}{(f - r) * 1e3:>12.1f}{f / r:>7.2f}{mb:>12}")
    if args.json:
        print(json.dumps({"bundle": str(args.bundle), "backend": model.backend,
                          "threads": args.threads, "repeats": args.repeats,
                          "input": {"dtype": spec.dtype, "shape": list(spec.shape[1:])},
                          "configurations": rows}))
    return 0


def profile_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk profile",
        description="Measure this device through the real interpreter on a bundle's own slices "
                    "and write a device profile: effective GMAC/s and per-invoke overhead per "
                    "thread count, plus every configuration's latency. By default it goes to "
                    "the cache that edge_sdk.load(bundle, profile='auto') reads.")
    p.add_argument("bundle")
    p.add_argument("--out", default=None, help="profile YAML to write (default: the cache)")
    p.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and every core)")
    p.add_argument("--repeats", type=int, default=50, help="timed invokes per slice")
    p.add_argument("--name", default=None, help="profile name (default: this host's name)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (the profile written, its fit and every row) instead "
                        "of the table")
    args = p.parse_args(argv)
    from edge_sdk.errors import ProfileError
    from edge_sdk.policy.measured import cached_profile_path, measure_profile
    from edge_sdk.policy.profiles import write_profile

    try:
        threads = None if args.threads is None else \
            [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        raise ProfileError(f"--threads must be comma-separated integers, got {args.threads!r}")
    prof, rows = measure_profile(args.bundle, threads, args.repeats, args.name)
    out = args.out or cached_profile_path(args.bundle)
    header = ("# Written by `edge-sdk profile`: every figure below was measured on this host\n"
              "# through the real interpreter on the bundle named in `sources`.\n")
    written = write_profile(prof, out, header)
    if args.json:
        fit = {route: {str(t): {"gmacs": f.gmacs, "overhead_us": round(f.overhead_ms * 1e3, 3)}
                       for t, f in sorted(table.items())}
               for route, table in prof.throughput.items()}
        print(json.dumps({"bundle": str(args.bundle), "profile": str(written),
                          "name": prof.name, "throughput": fit,
                          "rows": [{**r, "error": round(r["fitted_ms"] / r["measured_ms"] - 1, 4)}
                                   for r in rows]}))
        return 0
    print(f"{'threads':>7}  {'configuration':<16}{'MACs':>11}{'measured ms':>13}{'fitted ms':>11}"
          f"{'error':>8}")
    for r in rows:
        err = r["fitted_ms"] / r["measured_ms"] - 1
        print(f"{r['threads']:>7}  {r['config']:<16}{r['macs']:>11}{r['measured_ms']:>13.4f}"
              f"{r['fitted_ms']:>11.4f}{err:>+8.1%}")
    for route, table in prof.throughput.items():
        for t, f in sorted(table.items()):
            print(f"{route} {t} thread(s): {f.gmacs:.2f} GMAC/s effective, "
                  f"{f.overhead_ms * 1e3:.1f} us per invoke")
    print(written)
    return 0


def materialize_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk materialize",
        description="Write the plain-files bundle of a store bundle (layout files: one .tflite "
                    "per configuration file, for apps outside Python): every file materialised "
                    "from the verified weight store and checked against the sha256 the store "
                    "manifest lists, then written atomically. Needs no torch.")
    p.add_argument("bundle", help="a store bundle (manifest layout: store)")
    p.add_argument("--out", required=True, help="the files bundle directory to write")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--key", default=None,
                   help="sign the written bundle with this Ed25519 private key (required when "
                        "the store bundle is signed: its signature cannot cover the new "
                        "manifest; docs/signing.md)")
    p.add_argument("--trusted-key", action="append", default=None, metavar="PUBLIC_PEM",
                   help="materialise only a store bundle signed by this public key")
    args = p.parse_args(argv)
    from edge_sdk.bundle.reading import read_manifest
    from edge_sdk.store.to_files import materialize_bundle

    t0 = time.perf_counter()
    out, ms = materialize_bundle(args.bundle, args.out, force=args.force, key=args.key,
                                 trusted_keys=args.trusted_key)
    m = read_manifest(out)  # verify=True: every written file's size and sha256 once more
    total = sum(e.bytes for e in m.file_entries())
    print(f"wrote {out}: {len(ms)} files, {total / 2 ** 20:.2f} MiB, materialised in "
          f"{sum(ms.values()):.0f} ms (median {statistics.median(ms.values()):.1f} ms per file); "
          f"{time.perf_counter() - t0:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(sys.argv[1:]))
