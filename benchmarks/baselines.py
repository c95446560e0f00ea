"""Baselines a reviewer would ask for, side by side with ours, on MNIST and Fashion-MNIST.

Same architecture (nested_cnn_small at 28x28 grey; the baselines are its graph from stock
nn layers), same data (``trainer.data.load_data``: identical splits and normalisation), same
optimizer, lr schedule, batch size and epochs (the ``fashion_mnist`` config) for every method:

  det fp32 [+TS]        deterministic network at full width, without / with temperature scaling
  slimmable [+TS]       US-Nets: sandwich rule (max + min + 2 random widths per step), in-place
                        distillation, BN statistics re-collected per width after training
  independent [+TS]     a deterministic network trained separately at each width
                        (width 1.0 is the det fp32 network itself)
  ensemble K [+TS]      deep ensemble of K full-width deterministic networks (member 1 = det fp32)
  ours+PWFN / ours+SQS  nested Bayesian network (``trainer.train.train``), quantized, exported
                        (``exporters.export.export_bundle``); numbers are the bundle manifest's
                        ``test["calibrated"]``, measured through the TFLite interpreter; scopes
                        point, head and all (S posterior samples)

Temperatures are fitted on the validation split only; every number is on the untouched test
split; OOD AUROC separates the test split from notMNIST by predictive entropy. Bytes: fp32
parameters x 4 for baselines, .tflite bytes for ours. Train seconds: wall time of training (ours:
nested training + the quantizer's fine-tuning; export time is printed separately). Then checks
the three goals of issue 7 and prints PASS/MISS (never tuned to pass).

Needs ../shared/data/{mnist,fashion_mnist,notmnist_test}.npz. Reduced run (what the README quotes):

    OMP_NUM_THREADS=1 python benchmarks/baselines.py --datasets fashion_mnist,mnist --epochs 3 \
        --threads 1 --out runs/baselines

Smoke run: add ``--max-train 2000 --max-eval 1000 --epochs 1 --datasets mnist``.
``--max-train`` subsets the training split for every method (ours via a patched loader);
``--quantize-epochs`` / ``--quantize-subset`` bound the PWFN (epochs per round) and SQS
(epochs) fine-tuning, as benchmarks/pwfn.py and benchmarks/sqs.py do; ``--quantize-eval`` caps
the quantizers' internal progress evaluations (not the reported numbers, which the exporter
measures on the full splits).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_models, train_speed

import numpy as np  # noqa: E402
import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from edge_sdk import metrics as M  # noqa: E402
from exporters.calibrate import fit_temperature, predictive_probs  # noqa: E402
import trainer.quantize.pwfn  # noqa: E402,F401  (imported up front: fail fast, not after hours)
import trainer.quantize.sqs  # noqa: E402,F401
from edge_sdk.bundle import read_manifest  # noqa: E402
from exporters.export import ExportOptions, export_bundle  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.quantize.run import quantize_model  # noqa: E402
from trainer.train import train  # noqa: E402
from trainer.data import load_data, load_ood, subset  # noqa: E402
from trainer.evaluate import batches  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIDTHS = (0.25, 0.5, 0.75, 1.0)
SCOPES = ("point", "head", "all")


def log(*a) -> None:
    print(*a, flush=True)


# ------------------------------------------------------------------------------ metrics
def quality(logits: np.ndarray, labels: np.ndarray, ood_logits: np.ndarray, T: float) -> dict:
    """accuracy, NLL, ECE (15 bins), OOD AUROC (predictive entropy) of [S, N, C] logits at T."""
    probs = predictive_probs(logits, T)
    ood = predictive_probs(ood_logits, T)
    return {"accuracy": M.accuracy(probs, labels), "nll": M.nll(probs, labels),
            "ece": M.ece(probs, labels),
            "ood_auroc": M.ood_auroc(M.predictive_entropy(probs), M.predictive_entropy(ood)),
            "temperature": T}


def baseline_rows(method: str, width: float, logits: dict, labels: dict, nbytes: int,
                  seconds: float) -> list[dict]:
    """Two rows, without and with temperature scaling (T fitted on validation NLL)."""
    T = fit_temperature(logits["val"], labels["val"])
    return [dict(method=m, width=width, bytes=nbytes, train_seconds=seconds,
                 **quality(logits["test"], labels["test"], logits["ood"], t))
            for m, t in ((method, 1.0), (method + " +TS", T))]


def evaluate(models: list, sets: dict) -> dict:
    """[S, N, C] logits of one model (S=1) or an ensemble on every evaluation set."""
    return {k: np.stack([BM.logits_of(m, b) for m in models]) for k, b in sets.items()}


# ------------------------------------------------------------------------------ ours
@contextlib.contextmanager
def train_subset(n: int | None):
    """Make ``trainer.train.train`` see the same training subset as the baselines."""
    import trainer.train as T

    if not n:
        yield
        return
    original = T.load_data

    def patched(cfg):
        data = original(cfg)
        return replace(data, train=_subset(data.train, n))
    T.load_data = patched
    try:
        yield
    finally:
        T.load_data = original


def _subset(ds, n: int | None):
    if not n or n >= len(ds):
        return ds
    idx = np.sort(np.random.default_rng(0).permutation(len(ds))[:n])
    return subset(ds, idx, augment=ds.augment)


def run_ours(cfg, data, args, work: Path, ood_source: str) -> tuple[list[dict], dict]:
    quiet = lambda *a: None  # noqa: E731
    with train_subset(args.max_train):
        res = train(cfg, work / "trained", progress=False, log=quiet)
    log(f"  ours: nested Bayesian training {res.seconds:.0f} s")
    state = ckpt_io.load_checkpoint(res.checkpoint)
    # The quantizers' own before/after evaluations are progress logs only (the table's numbers
    # come from the exported bundle, on the full splits), so they run on capped val/test sets.
    first = lambda ds: subset(ds, np.arange(min(args.quantize_eval, len(ds))))  # noqa: E731
    qdata = replace(data, train=_subset(data.train, args.quantize_subset), val=first(data.val),
                    test=first(data.test))
    rows, timing = [], {"train": res.seconds}
    for method in ("pwfn", "sqs"):
        qcfg = copy.deepcopy(cfg)
        qcfg.quantize.method = method
        qcfg.quantize.pwfn.epochs_per_round = args.quantize_epochs
        qcfg.quantize.sqs.epochs = max(args.quantize_epochs, 1)
        qcfg.quantize.pwfn.samples = qcfg.quantize.sqs.samples = args.samples
        model = ckpt_io.model_from_checkpoint(state)
        t0 = time.perf_counter()
        path = quantize_model(model, qcfg, qdata, work / method, base_metrics=state.get("metrics"),
                              progress=False, log=quiet)
        timing[method] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bundle = work / f"bundle-{method}"
        export_bundle(path, bundle, ExportOptions(widths=WIDTHS, samples=args.samples,
                                                  scopes=SCOPES, ood_data=ood_source,
                                                  max_eval=args.max_eval, measure=False,
                                                  force=True), progress=False, log=quiet)
        timing[f"export_{method}"] = time.perf_counter() - t0
        log(f"  ours+{method.upper()}: quantize {timing[method]:.0f} s, export + TFLite "
            f"evaluation {timing[f'export_{method}']:.0f} s")
        for c in read_manifest(bundle).configurations:
            cal = c.test["calibrated"]
            name = f"ours+{method.upper()} {c.scope}" + ("" if c.scope == "point" else str(c.samples))
            rows.append(dict(method=name, width=c.width, bytes=sum(f.bytes for f in c.files),
                             train_seconds=res.seconds + timing[method], temperature=c.temperature,
                             **{k: cal.get(k) for k in ("accuracy", "nll", "ece", "ood_auroc")}))
    return rows, timing


# ------------------------------------------------------------------------------ one dataset
def run_dataset(name: str, args) -> dict:
    source = f"npz:{DATA / (name + '.npz')}"
    ood_source = f"npz:{DATA / 'notmnist_test.npz'}"
    cfg = load_config("fashion_mnist", [f"name={name}", f"data.source={source}",
                                        f"train.epochs={args.epochs}",
                                        f"train.threads={args.threads}",
                                        "train.eval_every=1000000"])  # evaluate at the end only
    data = load_data(cfg.data)
    train_ds = _subset(data.train, args.max_train)
    cap = lambda ds: ds if not args.max_eval else subset(ds, np.arange(min(args.max_eval, len(ds))))  # noqa: E731
    ood = load_ood(ood_source, data.spec)
    sets = {"val": batches(cap(data.val)), "test": batches(cap(data.test)), "ood": batches(cap(ood))}
    labels = {k: np.concatenate([y.numpy() for _, y in b]) for k, b in sets.items() if k != "ood"}
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    _, h, _, c = data.spec.shape
    arch = dict(num_classes=data.num_classes, in_channels=c, input_size=h)
    E, seed = args.epochs, cfg.seed
    log(f"\n== {name}: {len(train_ds)} train / {len(labels['val'])} val / {len(labels['test'])} "
        f"test / {len(np.concatenate([y.numpy() for _, y in sets['ood']]))} OOD (notMNIST)")
    rows = []

    torch.manual_seed(seed)
    det = BM.plain_cnn(1.0, **arch)
    det_s = BM.train_plain(det, cfg, train_ds, seed, E)
    det_logits = evaluate([det], sets)
    rows += baseline_rows("det fp32", 1.0, det_logits, labels, BM.fp32_bytes(det), det_s)
    log(f"  det fp32: {det_s:.0f} s")

    torch.manual_seed(seed)
    slim = BM.slimmable_cnn(**arch)
    slim_s = BM.train_slimmable(slim, cfg, train_ds, seed, E)
    for w in WIDTHS:
        lg = evaluate([BM.slim_at(slim, w, calib)], sets)
        rows += baseline_rows("slimmable", w, lg, labels,
                              BM.fp32_bytes(BM.plain_cnn(w, **arch)), slim_s)
    log(f"  slimmable (US-Nets): {slim_s:.0f} s")

    for w in WIDTHS:
        if w == 1.0:
            m, s, lg = det, det_s, det_logits
        else:
            torch.manual_seed(seed)
            m = BM.plain_cnn(w, **arch)
            s = BM.train_plain(m, cfg, train_ds, seed, E)
            lg = evaluate([m], sets)
        rows += baseline_rows("independent", w, lg, labels, BM.fp32_bytes(m), s)
    log("  independent widths done")

    if args.ensemble > 1:
        members, ens_s = [det], det_s
        for k in range(1, args.ensemble):
            torch.manual_seed(seed + k)
            m = BM.plain_cnn(1.0, **arch)
            ens_s += BM.train_plain(m, cfg, train_ds, seed + k, E)
            members.append(m)
        rows += baseline_rows(f"ensemble x{args.ensemble}", 1.0, evaluate(members, sets), labels,
                              args.ensemble * BM.fp32_bytes(det), ens_s)
        log(f"  ensemble x{args.ensemble}: {ens_s:.0f} s")

    ours, timing = run_ours(cfg, data, args, Path(args.out) / name, ood_source)
    rows += ours
    return {"dataset": name, "rows": rows, "timing": timing, "goals": goals(rows)}


# ------------------------------------------------------------------------------ goals, table
def _get(rows, method, width):
    return next(r for r in rows if r["method"] == method and abs(r["width"] - width) < 1e-6)


def goals(rows: list[dict]) -> list[str]:
    det = _get(rows, "det fp32 +TS", 1.0)["accuracy"]
    ours = sorted({r["method"] for r in rows if r["method"].startswith("ours")})
    out = []
    for m in ours:
        acc = _get(rows, m, 1.0)["accuracy"]
        ok = acc >= det - 0.005
        out.append(f"G1 full-width acc >= det fp32 - 0.5 pt | {m:<18} {acc:.4f} vs "
                   f"{det:.4f} - 0.005  {'PASS' if ok else 'MISS'}")

    def per_width(label: str, metric: str, holds) -> None:
        for base in ("slimmable +TS", "slimmable"):
            for m in ours:
                cells, ok = [], True
                for w in WIDTHS:
                    a, b = _get(rows, m, w)[metric], _get(rows, base, w)[metric]
                    ok &= holds(a, b)
                    cells.append(f"{w:g}: {a:.4f}/{b:.4f}")
                out.append(f"{label.format(base=f'{base:<13}')} | {m:<18} "
                           f"{'  '.join(cells)}  {'PASS' if ok else 'MISS'}")

    per_width("G2 ECE <= 0.5 x {base} every width", "ece", lambda a, b: a <= 0.5 * b)
    per_width("G3 OOD AUROC >= {base} + 5 pt every width", "ood_auroc",
              lambda a, b: a >= b + 0.05)
    return out


COLS = [("method", "{:<22}"), ("width", "{:>6.2f}"), ("accuracy", "{:>9.4f}"), ("ece", "{:>8.4f}"),
        ("nll", "{:>8.4f}"), ("ood_auroc", "{:>10.4f}"), ("bytes", "{:>9d}"),
        ("train_seconds", "{:>9.0f}")]
HEAD = ["method", "width", "accuracy", "ECE", "NLL", "OOD AUROC", "bytes", "train s"]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in rows:
        lines.append("| " + " | ".join(f.format(r[k]).strip() if r.get(k) is not None else "-"
                                        for k, f in COLS) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="mnist,fashion_mnist")
    p.add_argument("--epochs", type=int, default=10, help="training epochs for every method")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/baselines", help="results.json/.md, checkpoints, bundles")
    p.add_argument("--max-train", type=int, default=None, help="subset of the training split")
    p.add_argument("--max-eval", type=int, default=None,
                   help="cap on val / test / OOD samples (smoke runs; same cap for every method)")
    p.add_argument("--ensemble", type=int, default=3, help="deep ensemble members (<2: none)")
    p.add_argument("--samples", type=int, default=8, help="posterior samples (head / all scopes)")
    p.add_argument("--quantize-epochs", type=int, default=1,
                   help="PWFN retraining epochs per round and SQS fine-tuning epochs")
    p.add_argument("--quantize-subset", type=int, default=10000,
                   help="training samples used by PWFN/SQS fine-tuning (0 = all)")
    p.add_argument("--quantize-eval", type=int, default=2000,
                   help="val/test samples for the quantizers' internal progress evaluations")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    names = [d for d in args.datasets.split(",") if d]
    for n in names + ["notmnist_test"]:
        if not (DATA / f"{n}.npz").is_file():
            sys.exit(f"{DATA / (n + '.npz')} is missing: this benchmark needs ../shared/data")
    run = (f"run: datasets {','.join(names)}; epochs {args.epochs} (every method, fashion_mnist "
           f"config otherwise); train subset {args.max_train or 'full'}; eval cap "
           f"{args.max_eval or 'none'}; ensemble {args.ensemble}; posterior samples {args.samples}; "
           f"PWFN {args.quantize_epochs} epoch(s)/round + SQS {max(args.quantize_epochs, 1)} "
           f"epoch(s) on {args.quantize_subset or 'all'} samples; threads {args.threads}; "
           f"torch {torch.__version__}")
    log(run)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"run": run, "args": vars(args), "datasets": []}
    md = [f"Run: `{' '.join(sys.argv)}`", "", run]
    for name in names:
        t0 = time.perf_counter()
        res = run_dataset(name, args)
        res["wall_seconds"] = time.perf_counter() - t0
        results["datasets"].append(res)
        text = table(res["rows"])
        log(f"\n### {name} (test split; OOD = notMNIST; wall {res['wall_seconds']:.0f} s)\n{text}\n")
        log("\n".join(res["goals"]))
        md += ["", f"### {name}", "", text, "", "```", *res["goals"], "```"]
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text("\n".join(md) + "\n")
    log(f"\nwrote {out / 'results.json'} and {out / 'results.md'}")


if __name__ == "__main__":
    main()
