"""ResNet-20 nested by ``trainer.nest`` (issue 20's benchmark): both residual modes against a
deterministic ResNet-20 and a US-Nets (slimmable) ResNet-20, in one run, on the same data.

  det fp32          plain ResNet-20 (projection shortcuts), full width only
  slimmable         US-Nets: every conv / BN switchable by width (the stream narrows, as
                    residual="stage" does), sandwich rule + in-place distillation, BN
                    re-collected per width
  ours inner|stage  ``resnet20_cifar`` (= nest(ResNet20Cifar(), residual=...)) trained by
                    ``trainer.train`` with the cifar10 config's recipe, exported (point scope,
                    DEQUANTIZE); accuracy, MACs and host latency per width from the bundle, and
                    latency through the runtime (``edge_sdk.load(...).predict`` pinned to the
                    configuration, median of repeated single-image calls)

Every method gets the config's data (splits, normalisation, augmentation), optimizer, schedule,
batch size and epochs (benchmarks/baseline_models.py). Training time ratios are to det fp32
measured in this run. Needs ``--data DIR`` with ``cifar10_dev.npz`` (default ``../shared/data``).

Full run:  python benchmarks/resnet.py --threads 2
Smoke run: python benchmarks/resnet.py --max-train 500 --max-eval 200 --epochs 1 --out /tmp/r
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_models, baselines

import numpy as np  # noqa: E402
import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from baselines import (_nhwc, _subset, baseline_rows, bundle_rows, evaluate,  # noqa: E402
                       train_subset)
from edge_sdk.bundle import read_manifest  # noqa: E402
from exporters.export import ExportOptions, export_bundle  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.data import load_data, subset  # noqa: E402
from trainer.evaluate import batches  # noqa: E402
from trainer.models.plain import ResNet20Cifar  # noqa: E402
from trainer.train import train  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIDTHS = (0.25, 0.5, 0.75, 1.0)


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def runtime_latency(bundle: Path, x: np.ndarray, repeats: int) -> dict[str, float]:
    """Median end-to-end ``predict`` milliseconds per configuration, pinned, one image a call."""
    import edge_sdk

    model = edge_sdk.load(bundle)
    out = {}
    for c in read_manifest(bundle).configurations:
        model.warm_up(config_ids=[c.id])
        times = []
        for i in range(repeats):
            t0 = time.perf_counter()
            model.predict(x[i % len(x)], config_id=c.id)
            times.append(time.perf_counter() - t0)
        out[c.id] = 1e3 * float(np.median(times))
    return out


def run_ours(cfg, mode: str, args, eval_sets, labels, x_rt) -> list[dict]:
    from trainer.config import apply_overrides

    # width_mult 1: ResNet-20's own 16/32/64 channels (the cifar10 config halves VGG's)
    kwargs = f"{{residual: {mode}, nest_stem: {mode == 'stage'}}}"
    mcfg = apply_overrides(cfg, ["model.name=resnet20_cifar", "model.width_mult=1.0",
                                 f"model.kwargs={kwargs}"])
    work = Path(args.out) / f"ours-{mode}"
    with train_subset(args.max_train):
        res = train(mcfg, work / "trained", progress=False, log=lambda *a: None)
    bundle = work / "bundle"
    export_bundle(res.checkpoint, bundle, ExportOptions(widths=WIDTHS, max_eval=args.max_eval,
                                                        measure=True, force=True),
                  progress=False, log=lambda *a: None)
    rows = bundle_rows(bundle, f"ours {mode}", eval_sets, labels, res.seconds)
    lat = runtime_latency(bundle, x_rt, args.repeats)
    manifest = {c.width: c for c in read_manifest(bundle).configurations}
    for r in rows:
        c = manifest[r["width"]]
        r.update(host_ms=c.latency_ms, runtime_ms=lat[c.id])
    log(f"  ours {mode}: {res.seconds:.0f} s training")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--dataset", default="cifar10_dev")
    p.add_argument("--epochs", type=int, default=None, help="default: the cifar10 config's")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-train", type=int, default=None)
    p.add_argument("--max-eval", type=int, default=None)
    p.add_argument("--repeats", type=int, default=50, help="runtime calls per configuration")
    p.add_argument("--methods", default="det,slimmable,inner,stage")
    p.add_argument("--out", default="runs/resnet")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = f"npz:{Path(args.data) / (args.dataset + '.npz')}"
    over = [f"data.source={source}", f"train.threads={args.threads}", "train.eval_every=1000000"]
    cfg = load_config("cifar10", over + ([f"train.epochs={args.epochs}"] if args.epochs else []))
    data = load_data(cfg.data)
    train_ds = _subset(data.train, args.max_train)
    def cap(ds):
        return ds if not args.max_eval else subset(ds, np.arange(min(args.max_eval, len(ds))))
    sets = {"val": batches(cap(data.val)), "test": batches(cap(data.test))}
    labels = {k: np.concatenate([y.numpy() for _, y in b]) for k, b in sets.items()}
    eval_sets = {"val": _nhwc(cap(data.val)), "test": _nhwc(cap(data.test))}
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    _, h, _, c = data.spec.shape
    build = lambda: ResNet20Cifar(data.num_classes, c)  # noqa: E731
    x0 = next(iter(sets["test"]))[0]
    E, seed, methods = cfg.train.epochs, cfg.seed, args.methods.split(",")
    log(f"{args.dataset}: {len(train_ds)} train / {len(labels['test'])} test, {E} epochs")
    rows, det_s = [], None
    if "det" in methods:
        torch.manual_seed(seed)
        det = build()
        det_s = BM.train_plain(det, cfg, train_ds, seed, E)
        rows += baseline_rows("det fp32", 1.0, evaluate([det], sets), labels, BM.fp32_bytes(det),
                              BM.count_macs(det, x0), det_s)[1:]  # +TS: as ours (T fitted)
        log(f"  det fp32: {det_s:.0f} s")
    if "slimmable" in methods:
        torch.manual_seed(seed)
        slim = BM.slimmable_net(build())
        slim_s = BM.train_slimmable(slim, cfg, train_ds, seed, E)
        for w in WIDTHS:
            m = BM.slim_at(slim, w, calib)
            rows += baseline_rows("slimmable", w, evaluate([m], sets), labels,
                                  BM.fp32_bytes(m), BM.count_macs(m, x0), slim_s)[1:]
        log(f"  slimmable: {slim_s:.0f} s")
    for mode in ("inner", "stage"):
        if mode in methods:
            # latency does not depend on the pixels: raw uint8 images of the declared shape
            raw = np.random.default_rng(0).integers(0, 256, (16, *data.spec.shape[1:]), np.uint8)
            rows += run_ours(cfg, mode, args, eval_sets, labels["test"], raw)
    print(table(rows, det_s))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=float))


def table(rows: list[dict], det_s: float | None) -> str:
    lines = ["| method | width | acc | ECE | MACs | train s (x det) | host ms | runtime ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f" ({r['train_seconds'] / det_s:.2f}x)" if det_s else ""
        ms = lambda k: "-" if r.get(k) is None else f"{r[k]:.3f}"  # noqa: E731
        lines.append(f"| {r['method']} | {r['width']:g} | {r['accuracy']:.4f} | {r['ece']:.4f} | "
                     f"{r['macs'] / 1e6:.2f} M | {r['train_seconds']:.0f}{ratio} | "
                     f"{ms('host_ms')} | {ms('runtime_ms')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
