"""`predict`'s answer from a bundle with plain LiteRT, numpy and a YAML parser: no edge_sdk.

The worked example of docs/manifest.md, for apps that read the bundle themselves (in any
language: every step is a few lines of array code). It reproduces
``edge_sdk.load(bundle).predict(x, config_id=...)`` — label, probabilities, confidence,
entropy, mutual information, the out-of-distribution score, the conformal prediction set
(alpha 0.1, LAC), input_suspect and abstain — and, with no configuration named, the configuration
``predict`` picks without a budget (the lowest validation NLL; ties: larger width, then fewer
invokes). tests/edge_sdk/test_predict_with_litert.py checks it against the runtime.

    python docs/predict_with_litert.py BUNDLE x.npy [--config w1.00-head8] [--target 0.95]

``x.npy``: one raw sample, [H, W, C] (a grey model also takes [H, W]), values in the manifest's
``input.value_range``. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import yaml

try:  # LiteRT (pip install ai-edge-litert); tflite-runtime has the same Interpreter API
    from ai_edge_litert.interpreter import Interpreter
except ImportError:  # pragma: no cover - the tflite-runtime device venv
    from tflite_runtime.interpreter import Interpreter


def read_manifest(bundle: Path) -> dict:
    manifest = yaml.safe_load((bundle / "manifest.yaml").read_text())  # plain data, no tags
    # version 2 adds batch_dim (batch resizing), which one sample at a time does not need;
    # version 3 adds layout: a `files` bundle reads as version 2, a `store` bundle holds one
    # weight store its slices are materialised from (edge_sdk's job: `edge-sdk materialize
    # BUNDLE --out DIR` writes its files bundle); version 4 changes only the store layout's
    # manifest (keys the reader derives may be left out), so its `files` bundle reads as 3;
    # version 5 adds `uncertainty` (uncertainty.bin, read by read_uncertainty below);
    # version 6 adds `input_stats` (the training split's raw statistics, input_suspect below);
    # version 7 adds integer configurations (`weights: int8`): their .tflite files take and
    # give float32 like every other (QUANTIZE and DEQUANTIZE inside), so they run as is;
    # version 8 adds a cascade plan per target accuracy, which one slice alone does not need;
    # version 9 adds `input.preprocess`, a photo model's resize and centre crop, which makes
    # the raw sample this example takes from a photo (docs/manifest.md, Photos); version 10
    # adds a configuration's `val_accuracy`, which choosing by val_nll does not need
    if manifest["schema_version"] not in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10):
        raise ValueError(f"schema version {manifest['schema_version']}; this example reads 1-10")
    if manifest.get("layout", "files") != "files":
        raise ValueError(f"layout {manifest['layout']!r}: this example reads .tflite files; "
                         f"write them with `edge-sdk materialize {bundle} --out DIR`")
    return manifest


def read_uncertainty(bundle: Path, manifest: dict) -> tuple[dict, dict] | None:
    """uncertainty.bin (docs/store.md's container; version 2 is version 1 deflated with zlib
    after a 20-byte prefix). Version 1: b"EDGESTOR", u32 version, u64
    header length, the header JSON {"index", "arrays": {name: {dtype, shape, offset, bytes}}},
    zero padding to 16 bytes, then the arrays. Returns (index, arrays) or None."""
    entry = manifest.get("uncertainty")
    if entry is None:
        return None
    data = (bundle / entry["name"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{entry['name']}: sha256 differs from the manifest")
    magic, version, n = struct.unpack_from("<8sIQ", data)
    if magic == b"EDGESTOR" and version == 2:  # version 2: version 1, zlib-deflated
        data = zlib.decompress(data[20:])
        magic, version, n = struct.unpack_from("<8sIQ", data)
    if magic != b"EDGESTOR" or version != 1:
        raise ValueError(f"{entry['name']}: not a container of version 1 or 2")
    header = json.loads(data[20:20 + n])
    payload = -(-(20 + n) // 16) * 16
    arrays = {k: np.frombuffer(data, np.dtype(a["dtype"]), int(np.prod(a["shape"])),
                               payload + a["offset"]).reshape(a["shape"])
              for k, a in header["arrays"].items()}
    return header["index"], arrays


def ood_score(index: dict, arrays: dict, width_key: str, features: np.ndarray,
              z: np.ndarray) -> float:
    """The score the runtime appends to the slice's graph (edge_sdk/answers/ood_graph.py),
    here in numpy from the plain interpreter's outputs: u = f / max(|f|, 1e-6), then minus
    the cosine to the nearest bank row (index version 2: prototypes, k = 1; version 1: the
    k-th of 1,000 rows), plus for "energy+knn" the energy -logsumexp(z) of the (sample-mean)
    logits, both z-normalised. The int8 bank rows are unit vectors once renormalised."""
    bank = arrays[f"{width_key}/bank"].astype(np.float32)
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    f = features.reshape(-1).astype(np.float32)
    sims = bank @ (f / max(float(np.linalg.norm(f)), 1e-6))
    k = index["k"]
    knn = -float(np.partition(sims, len(sims) - k)[len(sims) - k])
    if index["score"] == "knn":
        return knn
    (me, se), (mk, sk) = (index["widths"][width_key]["fuse"][n] for n in ("energy", "knn"))
    zm = z.astype(np.float64).mean(0)
    energy = -float(zm.max() + np.log(np.exp(zm - zm.max()).sum()))
    return (energy - me) / se + (knn - mk) / sk


def lac_quantile(index: dict, arrays: dict, config_id: str, alpha: float = 0.1) -> float:
    """The LAC quantile of a configuration (version 2: one float32 array [keys, methods,
    alphas]; version 1: JSON lists, None = every class)."""
    a = index["alphas"].index(alpha)
    if index["version"] == 1:
        q = index["configs"][config_id]["lac"][a]
        return math.inf if q is None else q
    return float(arrays["quantiles"][index["quantile_keys"].index(config_id), 0, a])


def choose(manifest: dict, config_id: str | None) -> dict:
    """The named configuration, else predict's unconstrained choice: the lowest validation
    NLL, ties to the larger width, then to fewer invokes."""
    configs = manifest["configurations"]
    if config_id is not None:
        return next(c for c in configs if c["id"] == config_id)
    return min(configs, key=lambda c: (c["val_nll"], -c["width"], c["invokes"]))


def normalise(manifest: dict, x: np.ndarray) -> np.ndarray:
    """Raw sample -> the model's input tensor [1, H, W, C] float32: (raw - mean) / std."""
    spec = manifest["input"]
    _, h, w, c = spec["shape"]
    x = np.asarray(x, dtype=np.float32)
    if c == 1 and x.shape == (h, w):
        x = x[..., None]  # grey [H, W]: add the channel axis
    if x.shape != (h, w, c):
        raise ValueError(f"expected one sample of shape {[h, w, c]}, got {list(x.shape)}")
    lo, hi = spec["value_range"]
    if not (np.isfinite(x).all() and x.min() >= lo and x.max() <= hi):
        raise ValueError(f"values must be finite and lie in the raw range [{lo}, {hi}]")
    mean = np.asarray(spec["mean"], np.float32)  # per channel: broadcasts on the last axis
    std = np.asarray(spec["std"], np.float32)
    return ((x - mean) / std)[None].astype(np.float32)


def logits(bundle: Path, config: dict, x: np.ndarray, classes: int
           ) -> tuple[np.ndarray, np.ndarray | None]:
    """[S, C] logits: one invoke per file. point: [1, C]; head: one file answering [S, C];
    all: S files answering [1, C] each, stacked in file order. And the first file's second
    output (schema version 5: the features the OOD score reads), or None."""
    rows, features = [], None
    for entry in config["files"]:
        path = bundle / entry["name"]
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            raise ValueError(f"{path}: sha256 differs from the manifest")
        it = Interpreter(model_path=str(path), num_threads=1)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs = it.get_output_details()
        rows.append(it.get_tensor(outs[0]["index"]).reshape(-1, classes))
        if features is None and len(outs) > 1:
            features = it.get_tensor(outs[1]["index"])
    return np.concatenate(rows, 0), features


def input_suspect(manifest: dict, raw: np.ndarray) -> bool | None:
    """Whether the raw sample's per-channel mean or maximum lies outside the band the
    training samples span, widened by ``margin`` (None: the manifest has no input_stats)."""
    st = manifest.get("input_stats")
    if st is None:
        return None
    v = np.asarray(raw, np.float64).reshape(-1, st["channels"])
    m = st["margin"]
    for stat, bands in ((v.mean(0), st["sample_mean"]), (v.max(0), st["sample_max"])):
        for value, (lo, hi) in zip(stat.tolist(), bands):
            if not lo - m <= value <= hi + m:
                return True
    return False


def answer(manifest: dict, config: dict, z: np.ndarray, target: str = "0.95",
           unc: tuple[dict, dict] | None = None, features: np.ndarray | None = None,
           suspect: bool | None = None) -> dict:
    """Temperature, sample averaging, uncertainty, the OOD score and the conformal set, and
    the abstain rule (below the confidence threshold, out of distribution, or a suspect
    input)."""
    z_raw = z
    z = z.astype(np.float64) / config["temperature"]  # the same T divides every sample
    z -= z.max(-1, keepdims=True)
    p_s = np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # softmax per posterior sample
    p = p_s.mean(0)  # model average: the mean of the samples' probabilities
    label = int(p.argmax())
    confidence = float(p[label])

    def entropy(q: np.ndarray) -> np.ndarray:
        return -(q * np.log(np.where(q > 0, q, 1.0))).sum(-1)

    predictive = float(entropy(p))
    expected = float(entropy(p_s).mean())
    threshold = config["thresholds"][target]  # None: no confidence reaches the target
    score = inside = pset = None
    if unc is not None:
        index, arrays = unc
        wk = f"{config['width']:.2f}"
        if config["scope"] != "all" and features is not None:  # all: no score
            score = ood_score(index, arrays, wk, features, z_raw)
            inside = score <= index["widths"][wk]["threshold"]
        q = lac_quantile(index, arrays, config["id"])
        # LAC, plus the label itself: every set holds the answer (docs/uncertainty.md)
        pset = [i for i, v in enumerate(p.tolist()) if v >= 1.0 - q or i == label]
    return {
        "label": label, "class_name": manifest["labels"][label],
        "probs": [float(v) for v in p], "confidence": confidence,
        "entropy": predictive,
        "mutual_info": max(predictive - expected, 0.0) if len(p_s) > 1 else 0.0,
        "abstain": threshold is None or confidence < threshold or inside is False
        or suspect is True,
        "ood_score": score, "in_distribution": inside, "prediction_set": pset,
        "config_id": config["id"], "width": config["width"], "scope": config["scope"],
        "samples": config["samples"], "input_suspect": suspect,
    }


def predict(bundle: str | Path, x: np.ndarray, config_id: str | None = None,
            target: str = "0.95") -> dict:
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    config = choose(manifest, config_id)
    z, features = logits(bundle, config, normalise(manifest, x), len(manifest["labels"]))
    return answer(manifest, config, z, target, read_uncertainty(bundle, manifest), features,
                  input_suspect(manifest, x))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("input", help=".npy holding one raw sample")
    p.add_argument("--config", default=None, help="configuration id (default: predict's "
                                                  "choice without a budget)")
    p.add_argument("--target", default="0.95", help="target accuracy of the abstain threshold")
    args = p.parse_args(argv)
    out = predict(args.bundle, np.load(args.input, allow_pickle=False), args.config, args.target)
    print(json.dumps(out))
    return 0 if math.isfinite(out["confidence"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
