"""Screen one config variant at reduced scale on the validation split (issue 17): train a
built-in config with overrides on a training subset and print validation accuracy and NLL per
width (posterior mean, BN re-collected) as one JSON line. Never looks at the test split.

    python benchmarks/screen.py fashion_mnist 18000 runs/screen/a \\
        data.source=npz:DIR/fashion_mnist.npz train.epochs=5 train.threads=1 train.min_width=0.25

``--baseline slimmable`` (or ``det``) trains that baseline of ``benchmarks/baselines.py``
instead, on the same training subset, with the config's optimizer, schedule, epochs and seed,
and scores it the same way (BN re-collected per width on the same calibration images; no
temperature), so a variant of ours can be read against US-Nets on validation, seed for seed.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baselines

import torch  # noqa: E402

import baseline_models as BM  # noqa: E402
from baselines import WIDTHS, _subset, train_subset  # noqa: E402
from edge_sdk import metrics as M  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.data import load_data  # noqa: E402
from trainer.evaluate import batches  # noqa: E402
from trainer.train import train  # noqa: E402


def screen_baseline(method: str, cfg, n: int) -> dict:
    """Validation accuracy / NLL per width of a baseline trained on ``n`` training images."""
    data = load_data(cfg.data)
    train_ds = _subset(data.train, n)
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    val = batches(data.val)
    labels = torch.cat([y for _, y in val]).numpy()
    _, h, _, c = data.spec.shape
    build = lambda w: BM.plain_net(cfg, w, num_classes=data.num_classes,  # noqa: E731
                                   in_channels=c, input_size=h)
    if cfg.train.threads:  # null = torch's default, as train() does
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    if method == "det":
        net = build(1.0)
        BM.train_plain(net, cfg, train_ds, cfg.seed, cfg.train.epochs)
        nets = {1.0: net}
    else:
        slim = BM.slimmable_net(build(1.0))
        BM.train_slimmable(slim, cfg, train_ds, cfg.seed, cfg.train.epochs)
        nets = {w: BM.slim_at(slim, w, calib) for w in WIDTHS}
    out = {}
    for w, net in nets.items():
        probs = torch.softmax(torch.from_numpy(BM.logits_of(net, val)), -1).numpy()
        out[f"{w:g}"] = (round(M.accuracy(probs, labels), 4), round(M.nll(probs, labels), 4))
    return out


def main() -> None:
    args = sys.argv[1:]
    baseline = None
    if args[:1] == ["--baseline"]:
        baseline, args = args[1], args[2:]
    if len(args) < 3 or baseline not in (None, "slimmable", "det"):
        sys.exit(__doc__)
    name, n, out, *overrides = args
    cfg = load_config(name, overrides)
    t0 = time.perf_counter()
    if baseline:
        val = screen_baseline(baseline, cfg, int(n))
    else:
        with train_subset(int(n)):
            res = train(cfg, out, progress=False, log=lambda *a: None)
        val = {f"{w:g}": (round(r["accuracy"], 4), round(r["nll"], 4))
               for w, r in res.val.items()}
    print(json.dumps({"config": name, "method": baseline or "ours", "train_subset": int(n),
                      "overrides": overrides, "val": val,
                      "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
