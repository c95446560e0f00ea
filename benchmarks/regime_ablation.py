"""Issue 17's ablation: which part of the nested Bayesian training regime costs what.

Each variant is the ``cifar10`` config plus overrides, trained at reduced scale on
``cifar10_dev.npz`` (``--data``; a 20k/5k draw from CIFAR-10's training split) (default: ``model.width_mult`` 0.25, 6 epochs) and measured
on the **validation** split only (screening never looks at the test split): accuracy and NLL of
the posterior mean per width (BN re-collected; with and without the keep-probability rescale),
training accuracy of the last epoch (the sampled pass), OOD AUROC by predictive entropy against
the first half of each ``ood32_dev`` group (the second half is kept for reporting), median
seconds per epoch, MACs per width (counted on the forward graph) and the conditional keep
probabilities ``sigmoid(mubar)`` of the deepest units.

Variants run as separate processes, ``--jobs`` at a time with ``--threads`` each::

    python benchmarks/regime_ablation.py --variants shipped,plain,batch --jobs 2 --threads 1
    python benchmarks/regime_ablation.py --list

Results go to ``<out>/<variant>.json`` (a finished variant is not re-run unless ``--force``)
and the table to stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIDTHS = (0.25, 0.5, 0.75, 1.0)

# name -> overrides on the cifar10 config (on top of the common reduced-scale settings).
_SHIPPED = ["ordering.mask_scope=example", "ordering.coupling=layer", "train.sandwich=false",
            "bayes.kappa=0.01", "bayes.noise_start=0", "train.decay_scope=all"]
_BEST_SAMPLING = ["ordering.mask_scope=batch", "bayes.kappa=1e-5"]
VARIANTS: dict[str, list[str]] = {
    "shipped": _SHIPPED,
    "plain": _SHIPPED + ["model.frozen=8", "bayes.prior=none", "bayes.noise_start=1",
                         "train.eval_widths=[1.0]"],
    "kappa1e-5": _SHIPPED + ["bayes.kappa=1e-5"],
    "batch": _SHIPPED + _BEST_SAMPLING,
    "batch+coupled": _SHIPPED + _BEST_SAMPLING + ["ordering.coupling=network"],
    "batch+sandwich": _SHIPPED + _BEST_SAMPLING + ["train.sandwich=true"],
    "coupled+sandwich": _SHIPPED + _BEST_SAMPLING + ["ordering.coupling=network",
                                                     "train.sandwich=true"],
    "coupled+sandwich-nodistill": _SHIPPED + _BEST_SAMPLING + [
        "ordering.coupling=network", "train.sandwich=true", "train.distill=false"],
    "coupled+sandwich+warmup": _SHIPPED + _BEST_SAMPLING + [
        "ordering.coupling=network", "train.sandwich=true", "bayes.noise_start=0.67"],
    "coupled+sandwich+det": _SHIPPED + _BEST_SAMPLING + [
        "ordering.coupling=network", "train.sandwich=true", "bayes.noise_start=1"],
    "coupled+sandwich+wdmu": _SHIPPED + _BEST_SAMPLING + [
        "ordering.coupling=network", "train.sandwich=true", "train.decay_scope=weights"],
    "coupled+sandwich+kappa1e-2": _SHIPPED + [
        "ordering.mask_scope=batch", "ordering.coupling=network", "train.sandwich=true"],
}
# The shipped recipe since the full-scale run (batch masks, layer coupling, sandwich + in-place
# distillation, deterministic nested training) and one change at a time around it.
_RECIPE = _SHIPPED + _BEST_SAMPLING + ["train.sandwich=true", "bayes.noise_start=1"]
VARIANTS.update({
    "recipe": _RECIPE,
    "recipe+warmup": _RECIPE + ["bayes.noise_start=0.67"],  # weight noise in the last third
    "recipe+wdmu": _RECIPE + ["train.decay_scope=weights"],
    "recipe+mubar1": _RECIPE + ["ordering.init_mubar=1.0"],  # Downhill pass visits mid widths
    "recipe+bs256": _RECIPE + ["train.batch_size=256", "train.lr=0.1"],  # linear lr scaling
    "recipe+g16": _RECIPE + ["model.groups=16", "model.frozen=2"],  # same 1/8 always kept
    "recipe-distill": _RECIPE + ["train.distill=false"],
    # at 32x32 the VGG11 plan ends at 1x1: no hidden dense layer = GAP into the classifier
    "recipe+gap": _RECIPE + ["model.kwargs.hidden=0"],
    # the sandwich sums three passes' losses: the shared weights' step is ~3x a plain net's at
    # the same lr; half the lr tests whether the full width is over-stepped
    "recipe+lr0.025": _RECIPE + ["train.lr=0.025"],
    "recipe+lr0.1": _RECIPE + ["train.lr=0.1"],
    # the narrower passes' gradients pull the shared weights away from the full width's:
    # weight them down (trades narrow widths for full width)
    "recipe+sub0.5": _RECIPE + ["train.subnet_weight=0.5"],
    "recipe+sub0.25": _RECIPE + ["train.subnet_weight=0.25"],
    # US-Nets' n = 4: two uniform middle widths per step instead of one (a 4th pass)
    "recipe+mid2": _RECIPE + ["train.sampled_passes=2"],
    # Once-for-All's progressive shrinking: the full width alone first (one pass per step)
    "recipe+nested0.33": _RECIPE + ["train.nested_start=0.33"],
    "recipe+nested0.5": _RECIPE + ["train.nested_start=0.5"],
    # nn.Conv2d / nn.Linear's own init (the baselines'), not kaiming_normal: U(+-1/sqrt(fan_in))
    "recipe+torchinit": _RECIPE + ["model.init=torch"],
    "recipe+nested0.33+torchinit": _RECIPE + ["train.nested_start=0.33", "model.init=torch"],
})


def common(args) -> list[str]:
    return [f"data.source=npz:{args.data}", f"train.epochs={args.epochs}",
            f"model.width_mult={args.width_mult}", f"train.threads={args.threads}",
            f"train.eval_every={args.epochs}", f"seed={args.seed}"]


# ------------------------------------------------------------------------------ one variant
def count_macs(model, x) -> int:
    """Multiply-accumulates of one forward pass of a (truncated) model, from its layers' shapes."""
    import torch
    from trainer.layers import BayesNestedLayer

    total = [0]

    def hook(layer, _inp, out):
        per_out = layer.weight_mu[0].numel()  # in/groups * kh * kw, or in_features
        total[0] += out[0].numel() * per_out

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, BayesNestedLayer)]
    try:
        with torch.no_grad():
            model.eval()
            model(x[:1])
    finally:
        for h in handles:
            h.remove()
    return total[0]


def run_one(name: str, args) -> dict:
    import numpy as np
    import torch

    from edge_sdk.answers import metrics as M
    from trainer.config import load_config
    from trainer.data import load_data, load_ood, subset
    from trainer.evaluate import batches, evaluate_widths, predict_probs, recollect_bn
    from trainer.train import train

    cfg = load_config("cifar10", common(args) + VARIANTS[name] + args.set)
    res = train(cfg, Path(args.out) / name, progress=False, log=lambda *a: None)
    model = res.model
    data = load_data(cfg.data)
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed, batch=256)
    val = batches(data.val)
    ood = load_ood(f"npz:{args.ood}", data.spec)
    groups = np.asarray(ood.y)
    first_half = np.concatenate([np.flatnonzero(groups == g)[: (groups == g).sum() // 2]
                                 for g in (0, 1)])
    ood_sel = {g: subset(ood, first_half[groups[first_half] == g]) for g in (0, 1)}
    widths = cfg.train.eval_widths
    history = _history(res.checkpoint)
    out = {"name": name, "overrides": VARIANTS[name] + args.set, "train_seconds": res.seconds,
           "epoch_seconds": statistics.median(h["seconds"] for h in history),
           "train_acc": history[-1]["train_acc"], "widths": {}}
    for scaled in (True, False):
        table = evaluate_widths(model, calib, val, widths, scaled=scaled)
        for w, row in table.items():
            out["widths"].setdefault(f"{w:g}", {})[
                "acc" if scaled else "acc_unscaled"] = row["accuracy"]
            if scaled:
                out["widths"][f"{w:g}"]["nll"] = row["nll"]
    import copy
    work = copy.deepcopy(model)
    x0 = next(iter(val))[0]
    for w in widths:
        recollect_bn(work, calib, w)
        p_in, _ = predict_probs(work, val, w)
        ent_in = M.predictive_entropy(p_in)
        row = out["widths"][f"{w:g}"]
        for g, ds in ood_sel.items():
            p_out, _ = predict_probs(work, batches(ds), w)
            row[f"auroc_{'far' if g == 0 else 'near'}"] = M.ood_auroc(ent_in, M.predictive_entropy(p_out))
        row["macs"] = count_macs(model.truncate(w), x0)
    out["keep"] = {f"{i}": [round(float(v), 3) for v in torch.sigmoid(u.mubar.detach())]
                   for i, u in enumerate(model.orderings())}
    return out


def _history(path) -> list[dict]:
    from trainer import checkpoint as ckpt_io
    return ckpt_io.load_checkpoint(path)["metrics"]["history"]


# ------------------------------------------------------------------------------ table
def table(results: list[dict]) -> str:
    head = ("| variant | " + " | ".join(f"w{w:g} acc (unscaled)" for w in WIDTHS)
            + " | NLL w1 | AUROC w1 far/near | train acc | s/epoch | MMACs w1 | deep units g2 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        cells = []
        for w in WIDTHS:
            row = r["widths"].get(f"{w:g}")
            cells.append("–" if row is None else
                         f"{100 * row['acc']:.1f} ({100 * row['acc_unscaled']:.1f})")
        full = r["widths"]["1"]
        keep = list(r["keep"].values())
        deep = " ".join(f"{k[0]:.2f}" for k in keep[-4:-1] if k) or "–"
        lines.append(f"| {r['name']} | " + " | ".join(cells)
                     + f" | {full['nll']:.3f} | {full['auroc_far']:.3f}/{full['auroc_near']:.3f}"
                     + f" | {100 * r['train_acc']:.1f} | {r['epoch_seconds']:.1f}"
                     + f" | {full['macs'] / 1e6:.1f} | {deep} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="shipped,plain,batch")
    p.add_argument("--list", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--width-mult", type=float, default=0.25)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], help="extra override for every variant")
    p.add_argument("--data", default=str(DATA / "cifar10_dev.npz"))
    p.add_argument("--ood", default=str(DATA / "ood32_dev.npz"))
    p.add_argument("--out", default="runs/ablation")
    p.add_argument("--force", action="store_true")
    args = p.parse_args()
    if args.list:
        for k, v in VARIANTS.items():
            print(f"{k}: {' '.join(v)}")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        result = run_one(args.one, args)
        (out / f"{args.one}.json").write_text(json.dumps(result, indent=1))
        return
    if not Path(args.data).is_file():
        sys.exit(f"{args.data} not found: pass --data PATH/cifar10_dev.npz and --ood PATH/ood32_dev.npz")
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; --list shows them")

    def launch(name: str) -> None:
        if (out / f"{name}.json").is_file() and not args.force:
            return
        t0 = time.perf_counter()
        argv = [sys.executable, __file__, "--one", name] + sum(
            ([f"--{k.replace('_', '-')}", str(getattr(args, k))] for k in
             ("epochs", "width_mult", "threads", "seed", "data", "ood", "out")), [])
        argv += sum((["--set", s] for s in args.set), [])
        log = (out / f"{name}.log").open("w")
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
        print(f"{name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(launch, names))
    results = [json.loads((out / f"{n}.json").read_text()) for n in names
               if (out / f"{n}.json").is_file()]
    print(table(results))


if __name__ == "__main__":
    main()
