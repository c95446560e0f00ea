"""An OOD set the screen never saw (docs/uncertainty.md, "A third, unseen near-OOD set"): AUROC of
``ood_score`` and of the slice's entropy (TS softmax) per width, each width's float point
configuration pinned, cifar10_dev's test split as in-distribution, for each bundle given.

    python benchmarks/ood_unseen.py NEAR.npz BUNDLE [BUNDLE ...]

NEAR.npz: ``x_test`` uint8 [N, 32, 32, 3] (built outside this repository; the docs name its
source). Only edge_sdk's public API.
"""
import sys
from pathlib import Path

import numpy as np
import edge_sdk
from edge_sdk.answers import metrics as M

near = np.load(sys.argv[1])["x_test"]
bundles = sys.argv[2:]
test = np.load(Path(__file__).resolve().parents[2] / "shared/data/cifar10_dev.npz")
xt = test["x_test"]  # the exporter's test split of cifar10_dev (5,000 images)
for b in bundles:
    name = b.rstrip("/").rsplit("/", 1)[-1]
    m = edge_sdk.load(b, threads=2)
    for c in m.manifest.configurations:
        if not c.id.endswith("-point"):
            continue
        a = m.predict_batch(xt, config_id=c.id)
        o = m.predict_batch(near, config_id=c.id)
        auroc = M.ood_auroc(a.ood_score, o.ood_score)
        ent = M.ood_auroc(a.entropy, o.entropy)
        cov = float(o.in_distribution.mean())
        print(f"{name:<22}{c.id:<14} ood_score AUROC {auroc:.3f}  entropy {ent:.3f}  "
              f"accepted as in distribution {cov:.3f}", flush=True)
