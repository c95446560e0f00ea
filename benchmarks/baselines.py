"""Baselines a reviewer would ask for, side by side with ours, per dataset.

Each dataset has its own settings (:data:`DATASETS`): the config ours ships for it, the OOD set,
the epochs and its *reference families*: the model and recipe the deterministic baselines are
built from. Every method gets the same data (``trainer.data.load_data``: identical splits and
normalisation) and epochs; each reference family its own model, optimizer, lr schedule and
augmentation (cifar10_dev: ``vgg``, the VGG11 plan at width_mult 0.5 with the recipe the cifar10
config shipped in issue 17, and ``allconv``, issue 32's all-convolutional network with its
one-cycle recipe; other datasets: the config's own model and recipe). Per family:

  det fp32 [+TS]        deterministic network at full width
  slimmable [+TS]       US-Nets: sandwich rule (max + min + 2 random widths per step), in-place
                        distillation, BN statistics re-collected per width after training
  independent [+TS]     a deterministic network trained separately at each width
                        (width 1.0 is the det fp32 network itself)
  ensemble K [+TS]      deep ensemble of K full-width deterministic networks (member 1 = det
                        fp32; the first family only)
  ours float            our trained checkpoint before quantization (posterior mean, BN
                        re-collected per width, torch), scored like the baselines (+TS too)
  ours+PWFN / ours+SQS  nested Bayesian network, quantized, exported; every number is measured
                        on the bundle's .tflite files through the interpreter, at the bundle's
                        temperature (fitted on validation by the exporter); scopes point, head
                        and all (S posterior samples)

Scored identically for every method: accuracy, NLL, ECE (15 bins), Brier on the untouched test
split; OOD AUROC per OOD group with predictive entropy and with max-softmax. Temperatures are
fitted on validation for every method. Each OOD group (``ood32_dev``: far = colourised letters,
near = natural crops; notMNIST: one group) is split in halves: the default scope of our bundle
(and any recipe choice made on OOD numbers, ``benchmarks/screen.py --ood``) is chosen on the
first half, every reported AUROC is on the second. Bytes: fp32 parameters x 4 for baselines,
.tflite bytes for ours. MACs: counted on each network's forward graph (ours: the manifest's, from
the written graph). Train seconds: training wall time (ours: nested training + the quantizer's
fine-tuning; export is printed separately). Issue 32's goals are printed as PASS/MISS, every
comparison at the slice's MACs: a reference family's accuracy there is interpolated in log-MACs
between its measured widths, and the best family counts.

Needs ``--data DIR`` with the npz files (default ``../shared/data``; see its README for where the
public datasets come from). Full run (what the README quotes)::

    python benchmarks/baselines.py --datasets cifar10_dev,fashion_mnist --threads 2

Split across processes (``--references`` / ``--methods``), then merged::

    python benchmarks/baselines.py --datasets cifar10_dev --references allconv \
        --methods det,independent,slimmable --ensemble 0 --out runs/b/ref
    python benchmarks/baselines.py --datasets cifar10_dev --methods ours --out runs/b/ours
    python benchmarks/baselines.py --combine runs/b/ref/results.json runs/b/ours/results.json \
        --out runs/b

Smoke run: ``--datasets fashion_mnist --max-train 2000 --max-eval 1000 --epochs 1``.

Seeds: run it once per ``--set seed=K`` (same splits; the seed draws initial weights and batch
order), then ``--seed-mean A/results.json B/results.json ...`` prints the mean table, the spread
across seeds and the goals judged on the means.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_models, train_speed

import numpy as np  # noqa: E402
import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from edge_sdk.answers import metrics as M  # noqa: E402
from exporters.calibrate import fit_temperature, predictive_probs  # noqa: E402
import trainer.quantize.pwfn  # noqa: E402,F401  (imported up front: fail fast, not after hours)
import trainer.quantize.sqs  # noqa: E402,F401
from edge_sdk.bundle import SCOPES, read_manifest  # noqa: E402
from exporters.export import ExportOptions, export_bundle, slice_logits  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import config_to_dict, apply_overrides, load_config  # noqa: E402
from trainer.quantize.run import quantize_model  # noqa: E402
from trainer.train import train  # noqa: E402
from trainer.data import load_data, load_ood, nhwc_inputs, _resolve_augment as resolve_augment, subset  # noqa: E402
from trainer.evaluate import batches, predict_probs, recollect_bn  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIDTHS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Setting:
    config: str  # the built-in config ours ships for this data
    epochs: int
    ood: str  # npz file name (without .npz) of the OOD set
    overrides: tuple[str, ...] = ()
    # OOD label -> group name; None = one group named after the file
    ood_groups: dict | None = field(default=None, hash=False)
    # reference family -> overrides of the baselines' model and recipe (on top of the config);
    # () = the config's own model and recipe
    references: dict = field(default_factory=lambda: {"config": ()}, hash=False)


# Issue 17's VGG baselines: the VGG11 plan at width_mult 0.5 (38.7 M MACs) with the recipe the
# cifar10 config shipped for it (SGD + cosine at lr 0.05, per-image zero-padded crop + flip).
_VGG = ("model.name=nested_vgg", "model.width_mult=0.5", "model.init=torch",
        "train.schedule=cosine", "train.lr=0.05", "data.augment=crop_flip")
# Issue 32's reference: the all-convolutional network (32, 32 | 64, 64 | 128, 128, max-pool per
# stage, global average pooling; 38.6 M MACs) with its recipe: Nesterov SGD, one-cycle to lr
# 0.1, weight decay 5e-4 on every parameter, batch 128, one reflect-padded crop offset per batch
# + per-image flip.
_ALLCONV = ("model.name=nested_allconv", "model.width_mult=1.0", "train.schedule=onecycle",
            "train.lr=0.1", "train.decay_scope=all", "data.augment=crop_flip_batch")

DATASETS = {
    "cifar10_dev": Setting("cifar10", 15, "ood32_dev", (), {0: "far", 1: "near"},
                           {"vgg": _VGG, "allconv": _ALLCONV}),
    # notMNIST as one group, halved like ood32_dev's: benchmarks/screen.py --ood chose the
    # Fashion-MNIST recipe on its first half, so the reported AUROC is the second half's
    "fashion_mnist": Setting("fashion_mnist", 10, "notmnist_test", (), {None: "notmnist"}),
    "mnist": Setting("fashion_mnist", 10, "notmnist_test", ("name=mnist",), {None: "notmnist"}),
}


def log(*a) -> None:
    print(*a, flush=True)


# ------------------------------------------------------------------------------ metrics
def quality(logits: dict, labels: np.ndarray, T: float) -> dict:
    """Every number of one method at one width from its [S, N, C] logits at temperature T:
    test accuracy, NLL, ECE, Brier; per OOD group (reported half) AUROC by predictive entropy
    and by max-softmax (in-distribution = negative class)."""
    probs = predictive_probs(logits["test"], T)
    row = {"accuracy": M.accuracy(probs, labels), "nll": M.nll(probs, labels),
           "ece": M.ece(probs, labels), "brier": M.brier(probs, labels), "temperature": T}
    for key, lg in logits.items():
        kind, _, group = key.partition(":")
        if kind not in ("ood", "select"):
            continue
        pre = "" if kind == "ood" else "select_"  # select_*: only for choosing the default scope
        ood = predictive_probs(lg, T)
        row[f"{pre}auroc_{group}"] = M.ood_auroc(M.predictive_entropy(probs),
                                                 M.predictive_entropy(ood))
        row[f"{pre}auroc_msp_{group}"] = M.ood_auroc(-probs.max(-1), -ood.max(-1))
    return row


def baseline_rows(method: str, width: float, logits: dict, labels: dict, nbytes: int,
                  macs: int, seconds: float) -> list[dict]:
    """Two rows, without and with temperature scaling (T fitted on validation NLL)."""
    T = fit_temperature(logits["val"], labels["val"])
    return [dict(method=m, width=width, bytes=nbytes, macs=macs, train_seconds=seconds,
                 **quality(logits, labels["test"], t))
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


def _nhwc(ds) -> np.ndarray:
    return nhwc_inputs(ds)[0]


def bundle_rows(bundle: Path, method: str, eval_sets: dict, labels: np.ndarray,
                seconds: float) -> list[dict]:
    """Rows of every configuration of a bundle, scored by :func:`quality` on the interpreter's
    logits at the bundle's own temperature (the exporter fitted it on validation)."""
    from edge_sdk.store.sources import open_slices

    rows = []
    manifest = read_manifest(bundle)
    # either layout: files read and verified, or (store) materialised from the verified store
    slices = open_slices(bundle, manifest)
    for c in manifest.configurations:
        files = [slices[f.name] for f in c.files]
        logits = {k: slice_logits(files, c.scope, xs) for k, xs in eval_sets.items()}
        name = f"{method} {c.scope}" + ("" if c.scope == "point" else str(c.samples))
        rows.append(dict(method=name, width=c.width, bytes=sum(f.bytes for f in c.files),
                         macs=c.macs, train_seconds=seconds, unique=c.unique_values,
                         **quality(logits, labels, c.temperature)))
    return rows


def width_logits(model, calib: list, sets: dict, widths=WIDTHS) -> dict:
    """{width: {set: [1, N, C]}} of our float network at its posterior mean, BN re-collected per
    width on ``calib`` (this overwrites ``model``'s statistics: pass a copy to keep them).
    Log-probabilities stand in for logits: softmax(log p / T) = softmax(z / T)."""
    out = {}
    for w in widths:
        recollect_bn(model, calib, w)
        out[w] = {k: np.log(predict_probs(model, b, w)[0]) for k, b in sets.items()}
    return out


def float_rows_of(state: dict, calib: list, sets: dict, labels: dict, seconds: float) -> list:
    """The trained float network (posterior mean, BN re-collected per width, torch) scored like
    every baseline, +TS included: with the bundle's rows it shows what quantization and export
    cost in accuracy, NLL and AUROC."""
    logits = width_logits(ckpt_io.model_from_checkpoint(state), calib, sets)
    return [row for w, lg in logits.items()
            for row in baseline_rows("ours float", w, lg, labels, None, None, seconds)]


def run_ours(cfg, data, args, work: Path, eval_sets: dict, labels: dict,
             float_rows: list, sets: dict, calib: list) -> tuple[list[dict], dict]:
    quiet = lambda *a: None  # noqa: E731
    trained = work / "trained" / "checkpoint.pt"
    if args.reuse_trained and trained.is_file():
        # another part of this run trained it (--methods split across processes): reuse it,
        # with the training time it recorded
        state = ckpt_io.load_checkpoint(trained)
        seconds = state["metrics"]["train_seconds"]
        log(f"  ours: reusing {trained} (trained in {seconds:.0f} s)")
    else:
        with train_subset(args.max_train):
            res = train(cfg, work / "trained", progress=False, log=quiet)
        seconds = res.seconds
        log(f"  ours: nested Bayesian training {seconds:.0f} s")
        state = ckpt_io.load_checkpoint(res.checkpoint)
    float_rows += float_rows_of(state, calib, sets, labels, seconds)
    # The quantizers' own before/after evaluations are progress logs only (the table's numbers
    # come from the exported bundle, on the full splits), so they run on capped val/test sets.
    first = lambda ds: subset(ds, np.arange(min(args.quantize_eval, len(ds))))  # noqa: E731
    qdata = replace(data, train=_subset(data.train, args.quantize_subset), val=first(data.val),
                    test=first(data.test))
    rows, timing = [], {"train": seconds}
    for spec in args.quantizers.split(","):
        # "pwfn" or a variant with overrides of its section: "pwfn@max_order=1"
        method, _, opts = spec.partition("@")
        qcfg = copy.deepcopy(cfg)
        qcfg.quantize.method = method
        qcfg.quantize.pwfn.epochs_per_round = args.quantize_epochs
        qcfg.quantize.sqs.epochs = max(args.quantize_epochs, 1)
        # the quantizers' own sampled-ensemble reports stay as the config sets them (the
        # cifar10 config: SQS reports the point network only), so the wall time to the bundle
        # is what `edge-sdk train` spends; the bundle's S is --samples
        if opts:
            qcfg = apply_overrides(qcfg, [f"quantize.{method}.{o}" for o in opts.split("+")])
        label = method.upper() + (f"[{opts}]" if opts else "")
        model = ckpt_io.model_from_checkpoint(state)
        t0 = time.perf_counter()
        tag = spec.replace("@", "-").replace("=", "").replace("+", "-")
        path = quantize_model(model, qcfg, qdata, work / tag, base_metrics=state.get("metrics"),
                              progress=False, log=quiet)
        timing[label] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bundle = work / f"bundle-{tag}"
        export_bundle(path, bundle, ExportOptions(widths=WIDTHS, samples=args.samples,
                                                  scopes=SCOPES, max_eval=args.max_eval,
                                                  measure=False, force=True),
                      progress=False, log=quiet)
        timing[f"export_{label}"] = time.perf_counter() - t0
        log(f"  ours+{label}: quantize {timing[label]:.0f} s, export "
            f"{timing[f'export_{label}']:.0f} s")
        rows += bundle_rows(bundle, f"ours+{label}", eval_sets, labels["test"],
                            seconds + timing[label])
    return rows, timing


# ------------------------------------------------------------------------------ references
def run_references(family: str, cfg, train_ds, sets: dict, labels: dict, calib: list,
                   arch: dict, x0, methods: set, args, E: int, seed: int,
                   ensemble: int) -> list[dict]:
    """The deterministic baselines of one reference family (its model and recipe in ``cfg``):
    det fp32 at full width, US-Nets, a network trained alone at each width, a deep ensemble.
    Row names carry the family (``"allconv slimmable +TS"``) when a dataset has several."""
    pre = f"{family} " if family else ""
    build = lambda w: BM.plain_net(cfg, w, **arch)  # noqa: E731
    rows = []
    log(f"  reference {family or cfg.model.name}: {cfg.model.name} width_mult "
        f"{cfg.model.width_mult}, {cfg.train.optimizer} {cfg.train.schedule} lr {cfg.train.lr}, "
        f"augment {train_ds.augment}, {BM.count_macs(build(1.0), x0):,} MACs at full width")
    det = det_s = det_logits = None
    if methods & {"det", "independent", "ensemble"}:
        torch.manual_seed(seed)
        det = build(1.0)
        det_s = BM.train_plain(det, cfg, train_ds, seed, E)
        det_logits = evaluate([det], sets)
        if args.save_det:  # the plain network for benchmarks/precision.py's int8 baseline
            out = Path(args.out) / f"det_{family or cfg.model.name}.pt"
            torch.save({"state_dict": det.state_dict(), "arch": arch,
                        "config": config_to_dict(cfg)}, out)
            log(f"  {pre}det fp32 saved to {out}")
        rows += baseline_rows(pre + "det fp32", 1.0, det_logits, labels, BM.fp32_bytes(det),
                              BM.count_macs(det, x0), det_s)
        log(f"  {pre}det fp32: {det_s:.0f} s, test accuracy {rows[-1]['accuracy']:.4f}")

    if "slimmable" in methods:
        torch.manual_seed(seed)
        slim = BM.slimmable_net(build(1.0))
        slim_s = BM.train_slimmable(slim, cfg, train_ds, seed, E)
        for w in WIDTHS:
            m = BM.slim_at(slim, w, calib)
            rows += baseline_rows(pre + "slimmable", w, evaluate([m], sets), labels,
                                  BM.fp32_bytes(build(w)), BM.count_macs(build(w), x0), slim_s)
        log(f"  {pre}slimmable (US-Nets): {slim_s:.0f} s")

    if "independent" in methods and not args.no_independent:
        for w in WIDTHS:
            if w == 1.0 and det is not None:
                m, s, lg = det, det_s, det_logits
            else:
                torch.manual_seed(seed)
                m = build(w)
                s = BM.train_plain(m, cfg, train_ds, seed, E)
                lg = evaluate([m], sets)
            rows += baseline_rows(pre + "independent", w, lg, labels, BM.fp32_bytes(m),
                                  BM.count_macs(m, x0), s)
        log(f"  {pre}independent widths done")

    if "ensemble" in methods and ensemble > 1:
        members, ens_s = [det], det_s
        for k in range(1, ensemble):
            torch.manual_seed(seed + k)
            m = build(1.0)
            ens_s += BM.train_plain(m, cfg, train_ds, seed + k, E)
            members.append(m)
        rows += baseline_rows(f"{pre}ensemble x{ensemble}", 1.0, evaluate(members, sets),
                              labels, ensemble * BM.fp32_bytes(det),
                              ensemble * BM.count_macs(det, x0), ens_s)
        log(f"  {pre}ensemble x{ensemble}: {ens_s:.0f} s")
    return rows


# ------------------------------------------------------------------------------ one dataset
def ood_sets(setting: Setting, spec, data_dir: Path, cap) -> tuple[dict, dict]:
    """{group: dataset} for selection (first half of each group) and for reporting (second)."""
    ood = load_ood(f"npz:{data_dir / (setting.ood + '.npz')}", spec)
    y = ood.y.numpy()
    groups = setting.ood_groups or {None: setting.ood}
    select, report = {}, {}
    for label, name in groups.items():
        idx = np.arange(len(y)) if label is None else np.flatnonzero(y == label)
        if setting.ood_groups is None:  # one group without a selection role: report it all
            report[name] = cap(subset(ood, idx))
            continue
        half = len(idx) // 2
        select[name], report[name] = subset(ood, idx[:half]), cap(subset(ood, idx[half:]))
    return select, report


def run_dataset(name: str, args) -> dict:
    setting = DATASETS[name]
    data_dir = Path(args.data)
    source = f"npz:{data_dir / (name + '.npz')}"
    epochs = args.epochs or setting.epochs
    cfg = load_config(setting.config, [f"name={name}", f"data.source={source}",
                                       f"train.epochs={epochs}", f"train.threads={args.threads}",
                                       "train.eval_every=1000000", *setting.overrides,
                                       *args.set])
    data = load_data(cfg.data)
    train_ds = _subset(data.train, args.max_train)
    cap = lambda ds: ds if not args.max_eval else subset(ds, np.arange(min(args.max_eval, len(ds))))  # noqa: E731
    select, report = ood_sets(setting, data.spec, data_dir, cap)
    sets = {"val": batches(cap(data.val)), "test": batches(cap(data.test)),
            **{f"ood:{g}": batches(ds) for g, ds in report.items()},
            **{f"select:{g}": batches(ds) for g, ds in select.items()}}
    labels = {k: np.concatenate([y.numpy() for _, y in b]) for k, b in sets.items()
              if k in ("val", "test")}
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    _, h, _, c = data.spec.shape
    arch = dict(num_classes=data.num_classes, in_channels=c, input_size=h)
    E, seed = epochs, cfg.seed
    log(f"\n== {name}: {len(train_ds)} train / {len(labels['val'])} val / "
        f"{len(labels['test'])} test; OOD {setting.ood} groups "
        + ", ".join(f"{g}: {len(ds)} reported" for g, ds in report.items())
        + f"; ours: {cfg.model.name} width_mult {cfg.model.width_mult}, {E} epochs")
    rows, x0 = [], next(iter(sets["test"]))[0]
    methods = set(args.methods.split(","))
    wanted = args.references.split(",") if args.references else list(setting.references)
    unknown = sorted(set(wanted) - set(setting.references))
    if unknown:
        sys.exit(f"unknown references {unknown} for {name}; known: {sorted(setting.references)}")
    for i, ref in enumerate(wanted):
        rcfg = apply_overrides(copy.deepcopy(cfg), list(setting.references[ref]))
        # the reference's own augmentation on the same training images
        rtrain = copy.copy(train_ds)
        rtrain.augment = resolve_augment(rcfg.data.augment, data.spec)
        rows += run_references(ref if len(setting.references) > 1 else "", rcfg, rtrain, sets,
                               labels, calib, arch, x0, methods, args, E, seed,
                               ensemble=args.ensemble if i == 0 else 0)

    eval_sets = {"val": _nhwc(cap(data.val)), "test": _nhwc(cap(data.test)),
                 **{f"ood:{g}": _nhwc(ds) for g, ds in report.items()},
                 **{f"select:{g}": _nhwc(ds) for g, ds in select.items()}}
    float_rows: list = []
    timing: dict = {}
    if "ours" in methods:
        ours, timing = run_ours(cfg, data, args, Path(args.out) / name, eval_sets,
                                labels, float_rows, sets, calib)
        rows += float_rows + ours
    return {"dataset": name, "rows": rows, "timing": timing, "select_groups": sorted(select),
            "goals": goals(rows, select)}


# ------------------------------------------------------------------------------ goals, table
def _get(rows, method, width):
    return next((r for r in rows if r["method"] == method and abs(r["width"] - width) < 1e-6),
                None)


def _mean_auroc(row: dict, prefix: str) -> float:
    vals = [v for k, v in row.items() if k.startswith(prefix) and "_msp_" not in k]
    return float(np.mean(vals)) if vals else float("nan")


def default_scope(rows: list[dict], method: str, select: dict) -> str:
    """The scope our bundle should run by default: a sampled scope only if, on the *selection*
    halves of the OOD groups, its entropy AUROC averaged over widths beats the point slice's by
    >= 2 pt; otherwise point (+ temperature). Without selection halves: point."""
    if not select:
        return f"{method} point"
    best, best_gain = f"{method} point", 0.02
    point = [_get(rows, f"{method} point", w) for w in WIDTHS]
    for name in sorted({r["method"] for r in rows if r["method"].startswith(method + " ")}):
        if name.endswith(" point"):
            continue
        gain = np.mean([_mean_auroc(_get(rows, name, w), "select_auroc_")
                        - _mean_auroc(p, "select_auroc_") for w, p in zip(WIDTHS, point)])
        if gain >= best_gain:
            best, best_gain = name, gain
    return best


def _families(rows: list[dict], kind: str) -> dict[str, list[dict]]:
    """{family prefix: its +TS rows} of one baseline kind: ``"plain"`` (det fp32 and the
    networks trained alone per width) or ``"slimmable"`` (US-Nets)."""
    out: dict[str, dict[float, dict]] = {}
    for r in rows:
        m = r["method"]
        if not m.endswith(" +TS") or r.get("macs") is None:
            continue
        base = m[: -len(" +TS")]
        for suffix in (("det fp32", "independent") if kind == "plain" else ("slimmable",)):
            if base == suffix or base.endswith(" " + suffix):
                fam = base[: -len(suffix)].strip()
                out.setdefault(fam, {})[round(r["width"], 6)] = r
    return {f: sorted(ws.values(), key=lambda r: r["macs"]) for f, ws in out.items()}


def at_macs(family: list[dict], macs: int) -> float:
    """A family's accuracy at ``macs``: linear in log-MACs between its measured widths, held at
    its end points outside them (which favours the reference below its narrowest width)."""
    xs = np.log([r["macs"] for r in family])
    return float(np.interp(np.log(macs), xs, [r["accuracy"] for r in family]))


def best_at(rows: list[dict], kind: str, macs: int) -> tuple[float, str]:
    fams = _families(rows, kind)
    if not fams:
        return float("nan"), "-"
    acc, fam = max((at_macs(f, macs), name or "config") for name, f in fams.items())
    return acc, fam


def goals(rows: list[dict], select: dict) -> list[str]:
    """Issue 32's goals on the rows of one dataset: the bundle's default configuration (point
    slice + TS unless a sampled scope earns >= 2 pt AUROC on the selection halves) against the
    best reference network *at the slice's MACs* (accuracy interpolated in log-MACs)."""
    ours = sorted({r["method"].split(" ")[0] for r in rows if r["method"].startswith("ours+")})
    out = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    slims = _families(rows, "slimmable")
    for method in ours:
        chosen = default_scope(rows, method, select)
        out.append(f"{method}: default configuration {chosen!r} (chosen on the OOD selection "
                   f"halves; every figure below is on the reported halves)")
        accs = []
        for w in WIDTHS:
            r = _get(rows, chosen, w)
            if r is None:
                continue
            accs.append(r["accuracy"])
            slim, sf = best_at(rows, "slimmable", r["macs"])
            plain, pf = best_at(rows, "plain", r["macs"])
            line = (f"  w{w:g} ({r['macs'] / 1e6:.1f} M MACs): acc {r['accuracy']:.4f} | "
                    f"G2a >= best US-Nets {slim:.4f} [{sf}] {verdict(r['accuracy'] >= slim)}")
            if w < 0.75:
                line += (f" | G2b >= best plain {plain:.4f} [{pf}] "
                         f"{verdict(r['accuracy'] >= plain)}")
            elif w == 1.0:
                line += (f" | G2c >= best plain - 0.5 pt {plain - 0.005:.4f} [{pf}] "
                         f"{verdict(r['accuracy'] >= plain - 0.005)}")
            else:
                line += f" | (best plain {plain:.4f} [{pf}])"
            fl = _get(rows, "ours float +TS", w)
            if fl is not None and chosen.endswith(" point"):
                cost = fl["accuracy"] - r["accuracy"]
                line += (f" | G3 quantization cost {100 * cost:+.2f} pt <= 0.3 "
                         f"{verdict(cost <= 0.003)}")
            a = _mean_auroc(r, "auroc_")
            line += f" | AUROC(entropy, mean of groups) {a:.4f}"
            out.append(line)
        if len(accs) == len(WIDTHS):
            out.append(f"  G2d widths strictly increasing {verdict(all(np.diff(accs) > 0))}")
        r = _get(rows, chosen, 1.0)
        if r and slims:
            # the best US-Nets network: the highest full-width accuracy among the families
            fam, best = max(slims.items(), key=lambda kv: kv[1][-1]["accuracy"])
            t = best[-1]["train_seconds"]
            out.append(f"  G4 time to the bundle {r['train_seconds']:.0f} s (training + "
                       f"quantizer) vs the best US-Nets network's training [{fam or 'config'}] "
                       f"{t:.0f} s {verdict(r['train_seconds'] <= t)}")
    return out


def table(rows: list[dict]) -> str:
    groups = sorted({k[len("auroc_"):] for r in rows for k in r
                     if k.startswith("auroc_") and not k.startswith("auroc_msp_")})
    head = (["method", "width", "accuracy", "NLL", "ECE", "Brier"]
            + [f"AUROC {g} (ent / msp)" for g in groups] + ["T", "MACs", "bytes", "unique",
                                                             "train s"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        cells = [r["method"], f"{r['width']:.2f}", f(r.get("accuracy"), ".4f"),
                 f(r.get("nll"), ".4f"), f(r.get("ece"), ".4f"), f(r.get("brier"), ".4f")]
        for g in groups:
            e, m = r.get(f"auroc_{g}"), r.get(f"auroc_msp_{g}")
            cells.append("-" if e is None else f"{e:.3f} / {m:.3f}")
        cells += [f(r.get("temperature"), ".2f"), f(r.get("macs"), ","),
                  f(r.get("bytes"), ","), f(r.get("unique"), "d"),
                  f(r.get("train_seconds"), ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def combine(paths: list[str], out: Path) -> None:
    """One table per dataset from the rows of several partial runs (``--methods`` split across
    processes), with the goals recomputed on the merged rows."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    merged: dict[str, dict] = {}
    for run in runs:
        for res in run["datasets"]:
            m = merged.setdefault(res["dataset"], {"dataset": res["dataset"], "rows": [],
                                                    "timing": {}, "select_groups": [],
                                                    "wall_seconds": 0.0})
            m["rows"] += res["rows"]
            m["timing"].update(res.get("timing", {}))
            m["select_groups"] = sorted(set(m["select_groups"]) | set(res.get("select_groups", [])))
            m["wall_seconds"] = max(m["wall_seconds"], res.get("wall_seconds", 0.0))
    md = [f"Merged from: {', '.join(paths)}", ""] + [f"- {r['run']}" for r in runs]
    for name, res in merged.items():
        res["goals"] = goals(res["rows"], dict.fromkeys(res["select_groups"]))
        text = table(res["rows"])
        log(f"\n### {name} (test split; wall of the longest part {res['wall_seconds']:.0f} s)\n"
            f"{text}\n")
        log("\n".join(res["goals"]))
        md += ["", f"### {name}", "", text, "", "```", *res["goals"], "```"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"parts": [r["run"] for r in runs],
                                                  "datasets": list(merged.values())}, indent=1))
    (out / "results.md").write_text("\n".join(md) + "\n")
    log(f"\nwrote {out / 'results.json'} and {out / 'results.md'}")


def seed_mean(paths: list[str], out: Path) -> None:
    """One table per dataset whose every figure is the mean over several runs that differ only in
    ``--set seed=K`` (same data splits: ``data.split_seed`` is separate), with the goals judged on
    the means and the spread across seeds (sample standard deviation) of accuracy, NLL and
    entropy AUROC beside them: a per-width comparison closer than that spread is not a finding."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if len(runs) < 2:
        sys.exit(f"--seed-mean needs at least two runs, got {len(runs)}")
    by_name: dict[str, list[dict]] = {}
    for run in runs:
        for res in run["datasets"]:
            by_name.setdefault(res["dataset"], []).append(res)
    md = [f"Mean over seeds of: {', '.join(paths)}", ""] + [f"- {r['run']}" for r in runs]
    merged = []
    for name, parts in by_name.items():
        keys = [(r["method"], r["width"]) for r in parts[0]["rows"]]
        rows, spread = [], ["| method | width | accuracy sd | NLL sd | AUROC (ent) sd per group |",
                            "|---|---|---|---|---|"]
        for method, width in keys:
            found = [_get(p["rows"], method, width) for p in parts]
            found = [r for r in found if r is not None]
            row, sd = {"method": method, "width": width, "seeds": len(found)}, {}
            for k in found[0]:
                vals = [r[k] for r in found if isinstance(r.get(k), (int, float))]
                if len(vals) == len(found) and k != "width":
                    mean = float(np.mean(vals))  # counts (bytes, MACs, unique) stay ints
                    row[k] = round(mean) if all(isinstance(v, int) for v in vals) else mean
                    sd[k] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
            rows.append(row | {"sd": sd})  # a key of its own: goals and table read row keys
            if "accuracy" in sd and row["seeds"] > 1:
                aur = " / ".join(f"{sd[k]:.4f}" for k in sorted(sd)
                                 if k.startswith("auroc_") and not k.startswith("auroc_msp_"))
                spread.append(f"| {method} | {width:.2f} | {sd['accuracy']:.4f} | "
                              f"{sd['nll']:.4f} | {aur or '-'} |")
        select = dict.fromkeys(sorted(set().union(*(p.get("select_groups", []) for p in parts))))
        res = {"dataset": name, "seeds": len(parts), "rows": rows, "goals": goals(rows, select),
               "select_groups": sorted(select)}
        merged.append(res)
        text = table(rows)
        log(f"\n### {name}: mean of {len(parts)} seeds (test split)\n{text}\n\n"
            + "\n".join(spread) + "\n")
        log("\n".join(res["goals"]))
        md += ["", f"### {name}: mean of {len(parts)} seeds", "", text, "",
               "Spread across seeds (sample standard deviation):", "", *spread, "",
               "Goals judged on the means:", "", "```", *res["goals"], "```"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"parts": [r["run"] for r in runs],
                                                  "datasets": merged}, indent=1))
    (out / "results.md").write_text("\n".join(md) + "\n")
    log(f"\nwrote {out / 'results.json'} and {out / 'results.md'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="cifar10_dev,fashion_mnist",
                   help=f"comma-separated, from {sorted(DATASETS)}")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="directory of the npz files")
    p.add_argument("--epochs", type=int, default=None,
                   help="override every dataset's epochs (default: per dataset)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="config override for ours and "
                   "the baselines' shared recipe (e.g. train.batch_size=256); repeatable")
    p.add_argument("--out", default="runs/baselines", help="results.json/.md, checkpoints, bundles")
    p.add_argument("--max-train", type=int, default=None, help="subset of the training split")
    p.add_argument("--max-eval", type=int, default=None,
                   help="cap on val / test / OOD samples (smoke runs; same cap for every method)")
    p.add_argument("--ensemble", type=int, default=3, help="deep ensemble members (<2: none)")
    p.add_argument("--no-independent", action="store_true", help="skip independent widths")
    p.add_argument("--references", default=None,
                   help="reference families to train (comma-separated; default: every family "
                   "the dataset lists, e.g. vgg,allconv for cifar10_dev)")
    p.add_argument("--methods", default="det,slimmable,independent,ensemble,ours",
                   help="which methods to run (comma-separated); split one run across processes "
                   "and merge their results.json with --combine")
    p.add_argument("--combine", nargs="+", metavar="RESULTS_JSON", default=None,
                   help="merge the rows of several runs' results.json (same datasets and "
                   "settings) into --out, recomputing the goals; trains nothing")
    p.add_argument("--save-det", action="store_true",
                   help="also save each family's det fp32 network (state dict) in --out")
    p.add_argument("--reuse-trained", action="store_true",
                   help="ours: quantize the network an earlier part of this run trained in "
                   "OUT/DATASET/trained (its recorded training time counts) instead of training")
    p.add_argument("--quantizers", default="pwfn,sqs",
                   help="comma-separated; a variant overrides its section: "
                   "pwfn@max_order=1+epochs_per_round=2")
    p.add_argument("--samples", type=int, default=8, help="posterior samples (head / all scopes)")
    p.add_argument("--quantize-epochs", type=int, default=1,
                   help="PWFN retraining epochs per round and SQS fine-tuning epochs")
    p.add_argument("--quantize-subset", type=int, default=10000,
                   help="training samples used by PWFN/SQS fine-tuning (0 = all)")
    p.add_argument("--quantize-eval", type=int, default=2000,
                   help="val/test samples for the quantizers' internal progress evaluations")
    p.add_argument("--seed-mean", nargs="+", metavar="RESULTS_JSON", default=None,
                   help="average several runs that differ only in --set seed=K into --out "
                   "(mean table, spread across seeds, goals judged on the means); trains nothing")
    args = p.parse_args()
    if args.combine:
        combine(args.combine, Path(args.out))
        return
    if args.seed_mean:
        seed_mean(args.seed_mean, Path(args.out))
        return
    torch.set_num_threads(args.threads)
    names = [d for d in args.datasets.split(",") if d]
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        sys.exit(f"unknown datasets {unknown}; known: {sorted(DATASETS)}")
    for n in names + [DATASETS[n].ood for n in names]:
        if not (Path(args.data) / f"{n}.npz").is_file():
            sys.exit(f"{Path(args.data) / (n + '.npz')} is missing: pass --data DIR holding it")
    run = (f"run: datasets {','.join(names)}; epochs "
           + ", ".join(f"{n} {args.epochs or DATASETS[n].epochs}" for n in names)
           + f"; overrides {args.set or 'none'}; train subset {args.max_train or 'full'}; eval cap "
           f"{args.max_eval or 'none'}; ensemble {args.ensemble}; posterior samples {args.samples}; "
           f"methods {args.methods}; quantizers {args.quantizers}; "
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
        log(f"\n### {name} (test split; wall {res['wall_seconds']:.0f} s)\n{text}\n")
        log("\n".join(res["goals"]))
        md += ["", f"### {name}", "", text, "", "```", *res["goals"], "```"]
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text("\n".join(md) + "\n")
    log(f"\nwrote {out / 'results.json'} and {out / 'results.md'}")


if __name__ == "__main__":
    main()
