"""Same answer on the device: a photo bundle's recorded transform, applied by edge_sdk to the
test folder's JPEGs, against the exporter's own evaluation (issue 53, goal 4).

For every test photo:

1. **input**: ``edge_sdk.inputs.images.prepare(path, manifest.input.preprocess)`` against the
   uint8 array the exporter evaluated (``trainer.data.load_data`` of the manifest's recorded data
   config: the test split), bit for bit;
2. **answer**: for every point configuration, the evaluation's probabilities (the slice's logits
   through the interpreter on that array, at the configuration's temperature: what the manifest's
   test figures are computed from) against ``predict(path, config_id=...)`` and ``predict`` of the
   decoded full-size photo (a uint8 ``H x W x 3`` array), max |difference| and class agreement;
3. **cost**: the median whole-call ``latency_ms`` of ``predict`` on the prepared array and on the
   JPEG's path (decode + resize + crop on top), per point configuration;
4. **CLI**: ``edge-sdk run BUNDLE --input <jpeg> --json`` on the first ``--cli`` photos, against the
   evaluation of the configuration it chose::

    python benchmarks/photo_device.py runs/photos/ours/bundle --cli 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

import edge_sdk
from edge_sdk.answers import metrics as M
from edge_sdk.bundle import read_manifest
from edge_sdk.inputs.images import open_image, prepare
from edge_sdk.store.sources import open_slices
from exporters.configs import slice_logits
from trainer.config import config_from_dict
from trainer.data import load_data, nhwc_inputs
from trainer.folders import find_images, split_folders


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--cli", type=int, default=20, help="photos run through `edge-sdk run`")
    p.add_argument("--rounds", type=int, default=3, help="timed passes over 50 photos")
    args = p.parse_args()
    bundle = Path(args.bundle).resolve()
    manifest = read_manifest(bundle)
    pre = manifest.input.preprocess
    if pre is None:
        raise SystemExit(f"{bundle}: the manifest records no photo transform")
    cfg = config_from_dict({"data": dict(manifest.source["data"])}).data
    data = load_data(cfg)  # the exporter's evaluation arrays (same source, split seed)
    root = Path(cfg.source[len("imagefolder:"):])
    folders = split_folders(root)
    if not folders or "test" not in folders:
        raise SystemExit(f"{root}: expected a test/ folder (the exporter's test split)")
    paths = [q.decode() for q in find_images(folders["test"], manifest.labels)[0]]
    raw = data.test.raw
    same = [np.array_equal(prepare(q, pre), raw[i]) for i, q in enumerate(paths)]
    print(f"inputs: {sum(same)} of {len(paths)} test photos give the exporter's uint8 input "
          f"bit for bit", flush=True)

    x, _ = nhwc_inputs(data.test)
    slices = open_slices(bundle, manifest)
    model = edge_sdk.load(bundle)
    evals = {}
    print("\n| configuration | max abs(p_path - p_eval) | max abs(p_array - p_eval) | "
          "classes agree |\n|---|---|---|---|")
    for c in manifest.configurations:
        if c.scope != "point":
            continue
        logits = slice_logits([slices[f.name] for f in c.files], c.scope, x)
        ev = M.sample_probs(logits, c.temperature).mean(0)
        evals[c.id] = ev
        d_path = d_arr = 0.0
        agree = 0
        for i, q in enumerate(paths):
            a = model.predict(q, config_id=c.id)
            b = model.predict(np.asarray(open_image(q)), config_id=c.id)  # full-size photo
            d_path = max(d_path, float(np.abs(np.asarray(a.probs) - ev[i]).max()))
            d_arr = max(d_arr, float(np.abs(np.asarray(b.probs) - ev[i]).max()))
            agree += int(a.label == b.label == int(ev[i].argmax()))
        print(f"| {c.id} | {d_path:.2e} | {d_arr:.2e} | {agree} / {len(paths)} |", flush=True)

    # what a photo costs on top of the prepared array: decode + resize + crop, whole calls
    print("\n| configuration | predict(prepared array) ms | predict(jpeg path) ms | "
          "photo overhead ms |\n|---|---|---|---|")
    for c in manifest.configurations:
        if c.scope != "point":
            continue
        ms = {}
        for kind in ("array", "path"):
            xs = [raw[i] if kind == "array" else paths[i] for i in range(min(50, len(paths)))]
            for x_ in xs[:5]:
                model.predict(x_, config_id=c.id)  # warm
            ms[kind] = statistics.median(
                model.predict(x_, config_id=c.id).latency_ms for _ in range(args.rounds)
                for x_ in xs)
        print(f"| {c.id} | {ms['array']:.3f} | {ms['path']:.3f} | "
              f"{ms['path'] - ms['array']:.3f} |", flush=True)

    exe = Path(sys.executable).with_name("edge-sdk")
    worst, agree = 0.0, 0
    for i, q in enumerate(paths[:args.cli]):
        out = subprocess.run([str(exe), "run", str(bundle), "--input", q, "--json"],
                             check=True, capture_output=True, text=True).stdout
        ans = json.loads(out.strip().splitlines()[-1])
        ev = evals[ans["config_id"]][i]
        worst = max(worst, float(np.abs(np.asarray(ans["probs"]) - ev).max()))
        agree += int(ans["label"] == int(ev.argmax()))
    n = min(args.cli, len(paths))
    print(f"\nedge-sdk run --input <jpeg> --json: {agree} / {n} classes as the evaluation, "
          f"max abs(p - p_eval) {worst:.2e}")


if __name__ == "__main__":
    main()
