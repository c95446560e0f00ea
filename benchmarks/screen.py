"""Screen one config variant at reduced scale on the validation split (issue 17): train a
built-in config with overrides on a training subset and print validation accuracy and NLL per
width (posterior mean, BN re-collected) as one JSON line. Never looks at the test split.

    python benchmarks/screen.py fashion_mnist 18000 runs/screen/a \\
        data.source=npz:DIR/fashion_mnist.npz train.epochs=5 train.threads=1 train.min_width=0.25

``--baseline slimmable`` (or ``det``, or ``independent``: a plain network per width) trains that baseline of ``benchmarks/baselines.py``
instead, on the same training subset, with the config's optimizer, schedule, epochs and seed,
and scores it the same way (BN re-collected per width on the same calibration images; no
temperature), so a variant of ours can be read against US-Nets on validation, seed for seed.

``--ood PATH.npz`` also scores OOD detection per width on the *selection half* of that set (the
first half of its ``x_test``; ``benchmarks/baselines.py`` reports on the second half): validation
images are the in-distribution class, the temperature is fitted on validation NLL (as every
method's +TS row), and the AUROC is read by predictive entropy and by max-softmax.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baselines

import numpy as np  # noqa: E402
import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from baselines import WIDTHS, _subset, quality, train_subset, width_logits  # noqa: E402
from exporters.calibrate import fit_temperature  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.data import load_data, load_ood, subset  # noqa: E402
from trainer.evaluate import batches  # noqa: E402
from trainer.train import train  # noqa: E402


def ood_selection_half(path: str, spec) -> list:
    """The first half of an OOD set's images as evaluation batches (the half choices are made on)."""
    ood = load_ood(f"npz:{path}", spec)
    return batches(subset(ood, np.arange(len(ood) // 2)))


def score(val_logits, labels, ood_logits=None) -> list:
    """[accuracy, NLL] at T=1 and, with OOD logits, [T, AUROC entropy, AUROC max-softmax] at the
    temperature fitted on validation NLL; [1, N, C] logits scored by the baselines' own
    :func:`baselines.quality`, validation standing in for its test split."""
    q = quality({"test": val_logits}, labels, 1.0)
    row = [round(q["accuracy"], 4), round(q["nll"], 4)]
    if ood_logits is not None:
        T = fit_temperature(val_logits, labels)
        q = quality({"test": val_logits, "ood:sel": ood_logits}, labels, T)
        row += [round(T, 3), round(q["auroc_sel"], 4), round(q["auroc_msp_sel"], 4)]
    return row


def eval_sets(cfg, n: int, ood_path: str | None):
    """(data, training subset, BN calibration batches, validation batches, labels, OOD batches):
    the calibration images are the seeded draw train() takes from the same subset."""
    data = load_data(cfg.data)
    train_ds = _subset(data.train, n)
    calib = batches(train_ds, cfg.data.calib_samples, cfg.seed, batch=256)
    val = batches(data.val)
    labels = torch.cat([y for _, y in val]).numpy()
    ood = ood_selection_half(ood_path, data.spec) if ood_path else None
    return data, train_ds, calib, val, labels, ood


def screen_baseline(method: str, cfg, n: int, ood_path: str | None = None) -> dict:
    """Validation scores per width of a baseline trained on ``n`` training images."""
    data, train_ds, calib, val, labels, ood = eval_sets(cfg, n, ood_path)
    _, h, _, c = data.spec.shape
    build = lambda w: BM.plain_net(cfg, w, num_classes=data.num_classes,  # noqa: E731
                                   in_channels=c, input_size=h)
    if cfg.train.threads:  # null = torch's default, as train() does
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    if method in ("det", "independent"):
        nets = {}
        for w in (WIDTHS if method == "independent" else (1.0,)):
            torch.manual_seed(cfg.seed)
            nets[w] = build(w)
            BM.train_plain(nets[w], cfg, train_ds, cfg.seed, cfg.train.epochs)
    else:
        slim = BM.slimmable_net(build(1.0))
        BM.train_slimmable(slim, cfg, train_ds, cfg.seed, cfg.train.epochs)
        nets = {w: BM.slim_at(slim, w, calib) for w in WIDTHS}
    return {f"{w:g}": score(BM.logits_of(net, val)[None], labels,
                            BM.logits_of(net, ood)[None] if ood else None)
            for w, net in nets.items()}


def screen_ours(cfg, n: int, out: str, ood_path: str | None = None) -> dict:
    """Validation scores per width of our trained network (posterior mean, BN re-collected)."""
    with train_subset(n):
        res = train(cfg, out, progress=False, log=lambda *a: None)
    if not ood_path:
        return {f"{w:g}": [round(r["accuracy"], 4), round(r["nll"], 4)]
                for w, r in res.val.items()}
    _, _, calib, val, labels, ood = eval_sets(cfg, n, ood_path)
    logits = width_logits(copy.deepcopy(res.model), calib, {"val": val, "ood": ood},
                          cfg.train.eval_widths)
    return {f"{w:g}": score(lg["val"], labels, lg["ood"]) for w, lg in logits.items()}


def main() -> None:
    args = sys.argv[1:]
    baseline = ood = None
    while args[:1] in (["--baseline"], ["--ood"]):
        if args[0] == "--baseline":
            baseline = args[1]
        else:
            ood = args[1]
        args = args[2:]
    if len(args) < 3 or baseline not in (None, "slimmable", "det", "independent"):
        sys.exit(__doc__)
    name, n, out, *overrides = args
    cfg = load_config(name, overrides)
    t0 = time.perf_counter()
    val = (screen_baseline(baseline, cfg, int(n), ood) if baseline
           else screen_ours(cfg, int(n), out, ood))
    print(json.dumps({"config": name, "method": baseline or "ours", "train_subset": int(n),
                      "overrides": overrides, "ood": ood, "val": val,
                      "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
