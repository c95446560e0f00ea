"""Photos at the resolution users deploy: the shipped ``photos`` config against its baselines on
a real photo folder (issue 53's quality table), every method on the same splits and epochs.

  plain            torchvision's MobileNetV2 (trainer.models.plain, the config's width_mult),
                   trained alone with the config's recipe (optimizer, one-cycle, batch, epochs);
                   torch, temperature fitted on validation (+TS)
  US-Nets          the same nested model trained with US-Nets' regime (Yu & Huang 2019: sandwich
                   rule, max + min + 2 uniform widths per step, in-place distillation, no
                   full-width warm-up), BN re-collected per width; torch float, +TS
  ours             ``edge-sdk train --config photos`` (nested, SQS) -> ``edge-sdk export``; every
                   number from the bundle's .tflite slices through the interpreter, at the
                   bundle's temperature (fitted on validation by the exporter)
  ours pretrained  the plain network trained for half the epochs and saved, then
                   ``edge-sdk train --set model.weights=<it> --set train.epochs=<the other half>
                   --set train.nested_start=0`` -> export: equal total epochs

Scored on the folder's test split: accuracy, NLL, ECE, Brier, and OOD AUROC (predictive
entropy; in-distribution = negative class) against ``--ood`` (a second photo folder)::

    python benchmarks/photos.py --data clothing-dataset-small --ood ood_garments --out runs/photos

``--methods`` picks a subset; a method whose result exists under ``--out`` is reused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baselines, baseline_models

import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from baselines import baseline_rows, bundle_rows, evaluate, float_rows_of  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import apply_overrides, load_config  # noqa: E402
from trainer.data import load_data, load_ood, nhwc_inputs  # noqa: E402
from trainer.evaluate import batches  # noqa: E402
from trainer.models.plain import MobileNetV2  # noqa: E402

US_NETS = ("train.nested_start=0", "train.sandwich=true", "train.distill=true",
           "train.sampled_width=uniform", "train.sampled_passes=2")
METHODS = ("plain", "usnets", "ours", "pretrained")


def log(*a) -> None:
    print(*a, flush=True)


def cli(args: list[str], cwd: Path) -> None:
    """An ``edge-sdk`` command as a user runs it (the venv's entry point)."""
    exe = Path(sys.executable).with_name("edge-sdk")
    log("$ edge-sdk " + " ".join(args))
    subprocess.run([str(exe), *args], cwd=cwd, check=True)


def plain_net(cfg, classes: int) -> torch.nn.Module:
    return MobileNetV2(classes, 3, cfg.model.width_mult, cifar=cfg.data.image_size <= 64)


def train_plain(cfg, data, epochs: int, out: Path) -> float:
    if out.is_file():
        return json.loads(out.with_suffix(".json").read_text())["seconds"]
    torch.manual_seed(cfg.seed)
    net = plain_net(cfg, data.num_classes)
    seconds = BM.train_plain(net, cfg, data.train, cfg.seed, epochs)
    net.to(memory_format=torch.contiguous_format)
    torch.save(net.state_dict(), out)
    out.with_suffix(".json").write_text(json.dumps({"seconds": seconds, "epochs": epochs}))
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="photo folder (train/ val/ test/ or classes)")
    p.add_argument("--ood", required=True, help="a second photo folder: the OOD set")
    p.add_argument("--out", default="runs/photos")
    p.add_argument("--config", default="photos")
    p.add_argument("--epochs", type=int, default=None, help="default: the config's")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="config override (every method)")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir, ood_dir = Path(args.data).resolve(), Path(args.ood).resolve()
    sets = [f"data.source=imagefolder:{data_dir}", *args.set]
    cfg = apply_overrides(load_config(args.config), sets)
    epochs = args.epochs or cfg.train.epochs
    cfg = apply_overrides(cfg, [f"train.epochs={epochs}", f"train.threads={args.threads}"])
    sets += [f"train.epochs={epochs}", f"train.threads={args.threads}"]
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")

    data = load_data(cfg.data)
    spec = data.spec
    ood = load_ood(f"imagefolder:{ood_dir}", spec)
    sets_t = {"val": batches(data.val), "test": batches(data.test), "ood:ood": batches(ood)}
    labels = {"val": data.val.y.numpy(), "test": data.test.y.numpy()}
    eval_np = {"val": nhwc_inputs(data.val)[0], "test": nhwc_inputs(data.test)[0],
               "ood:ood": nhwc_inputs(ood)[0]}
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed, batch=256)
    log(f"{data.note}; OOD {ood_dir.name}: {len(ood)} photos; {epochs} epochs")
    rows: list[dict] = []

    if "plain" in methods:
        s = train_plain(cfg, data, epochs, out / "plain.pt")
        net = plain_net(cfg, data.num_classes)
        net.load_state_dict(torch.load(out / "plain.pt", weights_only=True))
        rows += baseline_rows("plain", 1.0, evaluate([net], sets_t), labels, None, None, s)
    if "usnets" in methods:
        ck = out / "usnets" / "checkpoint.pt"
        t0 = time.perf_counter()
        if not ck.is_file():
            cli(["train", "--config", args.config, "--out", str(ck.parent), "--no-progress",
                 *[a for s_ in sets + [*US_NETS, "quantize.method=none"]
                   for a in ("--set", s_)]], out)
        state = ckpt_io.load_checkpoint(ck)
        rows += [dict(r, method=r["method"].replace("ours float", "US-Nets"))
                 for r in float_rows_of(state, calib, sets_t, labels, time.perf_counter() - t0)]
    runs = {"ours": (out / "ours", []),
            "pretrained": (out / "pretrained", [f"model.weights={out / 'plain_half.pt'}",
                                                f"train.epochs={epochs - epochs // 2}",
                                                "train.nested_start=0"])}
    for name in ("ours", "pretrained"):
        if name not in methods:
            continue
        work, extra = runs[name]
        if name == "pretrained":
            train_plain(cfg, data, epochs // 2, out / "plain_half.pt")
        bundle = work / "bundle"
        t0 = time.perf_counter()
        if not (bundle / "manifest.yaml").is_file():
            cli(["train", "--config", args.config, "--out", str(work / "run"), "--no-progress",
                 *[a for s_ in sets + extra for a in ("--set", s_)]], out)
            cli(["export", str(work / "run-sqs" / "checkpoint.pt"), "--out", str(bundle),
                 "--ood-data", f"imagefolder:{ood_dir}", "--precisions", "float,int8",
                 "--force", "--no-progress"], out)
        label = "ours" if name == "ours" else "ours pretrained"
        rows += bundle_rows(bundle, label, eval_np, labels["test"], time.perf_counter() - t0)

    (out / f"results_{'_'.join(methods)}.json").write_text(json.dumps(rows, indent=1))
    log("\n| method | width | accuracy | NLL | ECE | OOD AUROC (entropy) |\n|---|---|---|---|---|---|")
    for r in rows:
        baseline = r["method"].startswith(("plain", "US-Nets"))
        if (baseline and "+TS" not in r["method"]) or r["method"].endswith(("head8", "all8")):
            continue  # baselines at their fitted temperature, like the bundle's slices
        log(f"| {r['method']} | {r['width']:.2f} | {r['accuracy']:.4f} | {r['nll']:.4f} | "
            f"{r['ece']:.4f} | {r.get('auroc_ood', float('nan')):.4f} |")


if __name__ == "__main__":
    main()
