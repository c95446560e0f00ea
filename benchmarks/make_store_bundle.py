"""An untrained nested_vgg store bundle for benchmarks/materialize.py (workstation, torch).

Materialisation time depends on the network's shapes, the store's encodings and S, not on what
training made of the weights, so the materialisation goals are measured on a freshly
initialised ``nested_vgg`` (the cifar10 recipe's model at ``--width-mult``, sigma initialised
as training's variational phase does) exported with ``--layout store``, every scope, S_max =
``--samples``. Quality figures of such a bundle mean nothing: the exporter still evaluates on
``--max-eval`` samples of the data, keep it small.

    python benchmarks/make_store_bundle.py --width-mult 0.5 --out /tmp/vgg05 \
        --data npz:/work/shared/data/cifar10_dev.npz
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from edge_sdk.bundle import SCOPES
from exporters.export import ExportOptions, export_bundle
from trainer import checkpoint as ckpt_io
from trainer.config import config_to_dict, load_config
from trainer.data import load_data
from trainer.train import build_model, start_variational_phase


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width-mult", type=float, default=0.5)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default="npz:/work/shared/data/cifar10_dev.npz")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-eval", type=int, default=200)
    p.add_argument("--calib-samples", type=int, default=256)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = load_config("cifar10", [f"data.source={args.data}",
                                  f"model.width_mult={args.width_mult}",
                                  f"data.calib_samples={args.calib_samples}"])
    data = load_data(cfg.data)
    model = build_model(cfg, data)
    start_variational_phase(model, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_io.build_checkpoint(model, input_spec=data.spec.to_dict(),
                                    config=config_to_dict(cfg), split_seed=data.split_seed)
    path = ckpt_io.save_checkpoint(ckpt, out / "checkpoint.pt")
    bundle = export_bundle(path, out / "bundle", ExportOptions(
        samples=args.samples, scopes=SCOPES, layout="store", measure=False,
        max_eval=args.max_eval, force=True), progress=False)
    print(bundle)


if __name__ == "__main__":
    main()
