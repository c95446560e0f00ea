"""How spread-out should SQS's posterior samples be? (issue 17, goal 3: a sampled scope must beat
its own point slice by >= 2 pt OOD AUROC, or the default export stays point + temperature.)

SQS samples each kept weight from its categorical over the window's components at the sampling
temperature ``sample_tau`` (SQS eq. 9; ``SQSConfig.sample_tau``, default 0.05). A colder
posterior makes the samples near-copies of the greedy network (no mutual information, no OOD
gain); a hotter one spreads them (more disagreement on OOD inputs, but each sample is a worse
network). This screen draws S networks per ``--taus`` value from an SQS checkpoint, re-collects
each sample's batch norm (as the exporter does) and measures, per width, on the **validation**
split and the **selection halves** of the OOD groups (the first half of each group, the same
halves ``benchmarks/baselines.py`` picks configurations on; the other halves and the test split
are never read): accuracy, NLL and mean mutual information of the S-sample average, and AUROC by
predictive entropy and by mutual information, against the point (greedy) slice. Torch, float
weights (the exported slices add int8 on top).

    python benchmarks/sample_tau.py --checkpoint runs/.../sqs/checkpoint.pt \\
        --ood npz:/work/shared/data/ood32_dev.npz [--taus 0.05,0.2,0.5,1] [--widths 0.25,1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from edge_sdk.answers import metrics as M
from exporters.slice import make_slice
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data, load_ood, nhwc_inputs, subset
from trainer.evaluate import batches
from trainer.quantize.sqs import sample_from_posterior


def selection_halves(ood) -> dict[str, object]:
    """The first half of each OOD group (0 = far, 1 = near when the set has two groups)."""
    groups = np.asarray(ood.y)
    names = {0: "far", 1: "near"} if set(np.unique(groups)) <= {0, 1} else {}
    out = {}
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        out[names.get(int(g), f"g{g}")] = subset(ood, idx[: len(idx) // 2])
    return out


@torch.no_grad()
def probs_of(net, xs: list[torch.Tensor]) -> list[np.ndarray]:
    return [torch.softmax(net(x).double(), -1).numpy() for x in xs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="an SQS checkpoint (quantize.method sqs)")
    p.add_argument("--ood", required=True, help="OOD source, e.g. npz:DIR/ood32_dev.npz")
    p.add_argument("--taus", default="0.05,0.2,0.5,1.0")
    p.add_argument("--widths", default="0.25,1.0")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-eval", type=int, default=2000, help="validation inputs (and per OOD group)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = ckpt_io.load_checkpoint(args.checkpoint)
    post = ckpt.get("posterior")
    if not post or post.get("kind") != "sqs":
        raise SystemExit(f"{args.checkpoint} has no SQS posterior (quantize it with method sqs)")
    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt).eval()
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed, batch=256)

    def tensor(ds) -> torch.Tensor:
        x, _ = nhwc_inputs(ds, args.max_eval)
        return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()

    x_val, y_val = nhwc_inputs(data.val, args.max_eval)
    xs = {"val": torch.from_numpy(x_val).permute(0, 3, 1, 2).contiguous()}
    xs.update({k: tensor(v) for k, v in selection_halves(load_ood(args.ood, spec)).items()})
    keys = list(xs)
    widths = [float(w) for w in args.widths.split(",")]
    taus = [float(t) for t in args.taus.split(",")]
    print(f"{args.checkpoint}: checkpoint sample_tau {post['sample_tau']:g}; S = {args.samples}; "
          f"validation {len(y_val)}, OOD selection halves "
          + ", ".join(f"{k} {len(xs[k])}" for k in keys[1:]), flush=True)
    ood_keys = keys[1:]
    head = (f"| width | posterior | acc | NLL | MI (val) | "
            + " | ".join(f"AUROC {k} ent / MI" for k in ood_keys) + " | s |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for w in widths:
        t0 = time.perf_counter()
        point = probs_of(make_slice(model, w, calib), list(xs.values()))
        ent = [M.predictive_entropy(q[None]) for q in point]
        rows.append(f"| {w:g} | point (greedy) | {100 * M.accuracy(point[0], y_val):.2f} | "
                    f"{M.nll(point[0], y_val):.3f} | 0 | "
                    + " | ".join(f"{M.ood_auroc(ent[0], ent[i]):.3f} / –"
                                 for i in range(1, len(keys)))
                    + f" | {time.perf_counter() - t0:.0f} |")
        for tau in taus:
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(0)
            draws = [probs_of(make_slice(model, w, calib, sample_from_posterior(post, tau, gen)),
                              list(xs.values())) for _ in range(args.samples)]
            ps = [np.stack([d[i] for d in draws]) for i in range(len(keys))]  # [S, N, C] per set
            mean = ps[0].mean(0)
            ent = [M.predictive_entropy(q) for q in ps]
            mi = [M.mutual_information(q) for q in ps]
            rows.append(f"| {w:g} | S={args.samples}, tau {tau:g} | "
                        f"{100 * M.accuracy(mean, y_val):.2f} | {M.nll(mean, y_val):.3f} | "
                        f"{float(mi[0].mean()):.4f} | "
                        + " | ".join(f"{M.ood_auroc(ent[0], ent[i]):.3f} / "
                                     f"{M.ood_auroc(mi[0], mi[i]):.3f}" for i in range(1, len(keys)))
                        + f" | {time.perf_counter() - t0:.0f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
