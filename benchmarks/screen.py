"""Screen one config variant at reduced scale on the validation split (issue 17): train a
built-in config with overrides on a training subset and print validation accuracy and NLL per
width (posterior mean, BN re-collected) as one JSON line. Never looks at the test split.

    python benchmarks/screen.py fashion_mnist 18000 runs/screen/a \\
        data.source=npz:DIR/fashion_mnist.npz train.epochs=5 train.threads=1 train.min_width=0.25
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baselines

from baselines import train_subset  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.train import train  # noqa: E402


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    name, n, out, *overrides = sys.argv[1:]
    cfg = load_config(name, overrides)
    t0 = time.perf_counter()
    with train_subset(int(n)):
        res = train(cfg, out, progress=False, log=lambda *a: None)
    val = {f"{w:g}": (round(r["accuracy"], 4), round(r["nll"], 4)) for w, r in res.val.items()}
    print(json.dumps({"config": name, "train_subset": int(n), "overrides": overrides, "val": val,
                      "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
