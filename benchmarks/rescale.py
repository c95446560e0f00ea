"""The keep-probability rescale (BN³ App. 8.2) on and off, on one trained checkpoint: validation
accuracy and NLL per width (and NLL after temperature scaling, fitted on the even validation
images and scored on the odd ones), BN re-collected per width either way (issue 32).

    python benchmarks/rescale.py --checkpoint runs/screen/x/checkpoint.pt [--train-subset 9000]

``--train-subset`` draws the BN calibration images from the same seeded training subset the
run trained on (``benchmarks/screen.py`` / ``baselines.py``'s ``_subset``). Never reads the
test split.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baselines

import numpy as np  # noqa: E402
import torch  # noqa: E402

from baselines import _subset  # noqa: E402
from edge_sdk.answers import metrics as M  # noqa: E402
from exporters.calibrate import fit_temperature, predictive_probs  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import config_from_dict  # noqa: E402
from trainer.data import load_data  # noqa: E402
from trainer.evaluate import batches, predict_probs, recollect_bn  # noqa: E402
from trainer.ordering import rescale_of  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train-subset", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    state = ckpt_io.load_checkpoint(args.checkpoint)
    cfg = config_from_dict(state["config"])
    data = load_data(cfg.data)
    calib = batches(_subset(data.train, args.train_subset), cfg.data.calib_samples, cfg.seed,
                    batch=256)
    val = batches(data.val)
    model = ckpt_io.model_from_checkpoint(state)
    print(f"{args.checkpoint}: the recorded regime's default rescale is "
          f"{'on' if rescale_of(state['config']) else 'off'}")
    print("NLL +TS: temperature fitted on the even validation images, NLL on the odd ones")
    print("| rescale | " + " | ".join(f"w{w:g} acc / NLL / NLL +TS" for w in cfg.train.eval_widths)
          + " |")
    print("|---|" + "---|" * len(cfg.train.eval_widths))
    for rescale in (True, False):
        model.set_rescale(rescale)
        cells = []
        for w in cfg.train.eval_widths:
            recollect_bn(model, calib, w)
            probs, labels = predict_probs(model, val, w)
            # alternate images, not the first and second half: a split may be ordered by class
            logits, fit, score = np.log(probs), slice(0, None, 2), slice(1, None, 2)
            T = fit_temperature(logits[:, fit], labels[fit])
            ts = M.nll(predictive_probs(logits[:, score], T), labels[score])
            cells.append(f"{M.accuracy(probs[0], labels):.4f} / {M.nll(probs[0], labels):.4f}"
                         f" / {ts:.4f}")
        print(f"| {'on' if rescale else 'off'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
