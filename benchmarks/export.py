"""Issue 21's measured goals for one checkpoint: the store bundle's bytes against the
full-width point slice and the fp32 model, and the store route against the files route.

Exports (``--out DIR``): ``DIR/store-point`` (layout store, point only), ``DIR/store-all``
(layout store, point + head + all, S in ``--sample-counts``: default 1, 2, 4, .. and
``--samples``) and ``DIR/files-all`` (layout files,
point + head + all at S = ``--samples``: the version-1/2 per-slice files). Bundle bytes are
every byte in the bundle directory (:func:`exporters.export.bundle_bytes`: store.bin +
manifest.yaml + anything else). Prints and (``--md``) writes:

- (a) store-point / the full-width point slice's int8 .tflite (the files route's
  ``w1.00-point.tflite``), goal <= 1.15x; (b) store-all / the same, goal <= 1.6x; (c) a PWFN
  checkpoint's store-point / the same (goal <= 0.7x at <= 32 unique values); (d) store-all /
  the fp32 full model (the float route's full-width point slice, ``weights="float"``), goal
  <= 0.4x; the store and manifest bytes of each;
- store vs files per width: point slice accuracy and OOD AUROC difference (goal within
  0.2 pt) and top-1 agreement on the test inputs (goal >= 99 %); head S and all S (S =
  ``--samples``) accuracy and AUROC differences (goal within 0.2 pt: the generators differ);
- the sampled scopes' seed spread (``--seeds``, default 0,100,200: seed sets far enough apart
  that no two share a sample seed): each route exported again at every further seed
  (``DIR/seed<n>/store-all``, ``DIR/seed<n>/files-all``: head + all at S only) and, per width
  and scope, the store-minus-files difference at each seed set, its mean over the seed sets
  and each route's own range (max - min over its seed sets, same sampler). One set of S draws
  is one draw of the ensemble: a single-seed difference is only a difference of the routes
  when it exceeds the routes' own seed-to-seed range (issue 21: it did not, docs/store.md §7).

    python benchmarks/export.py --checkpoint runs/demo/train/checkpoint.pt --out /tmp/b21 \\
        [--ood-data npz:DIR/notmnist_test.npz] [--samples 8] [--max-eval 1000] [--md out.md] \\
        [--seeds 0,100,200]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from edge_sdk.bundle import read_manifest
from edge_sdk.store.sources import open_slices
from exporters.export import ExportOptions, bundle_bytes, export_bundle
from exporters.layouts import sample_counts
from exporters.measure import run_tflite
from exporters.slice import make_slice, posterior_kind
from exporters.tflite import export_point_slice
from trainer import checkpoint as ckpt_io
from trainer.config import config_from_dict
from trainer.data import load_data, nhwc_inputs
from trainer.evaluate import batches


def _point_logits(bundle: Path, manifest, config_id: str, xs: np.ndarray) -> np.ndarray:
    # either layout through the runtime's slice source: read or materialised, sha256-verified
    c = manifest.configuration(config_id)
    return run_tflite(open_slices(bundle, manifest)[c.files[0].name], xs)[:, 0]


def _pt(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{100 * (a - b):+.2f}"


def _seed_spread(m: dict, fa, seeds: list[int], samples: int) -> list[str]:
    """Per width and sampled scope: store - files (accuracy / AUROC, pt) at every seed set,
    the mean of those differences and each route's own range over its seed sets."""
    def run(layout: str, n: int):
        return m[f"{layout}-all" if n == seeds[0] else f"seed{n}/{layout}-all"]

    def pts(v: list[float]) -> str:
        return f"{100 * (max(v) - min(v)):.2f}"

    lines = [f"Seed spread of the sampled scopes (S = {samples}; seed sets "
             f"{', '.join(map(str, seeds))}; calibrated accuracy / OOD AUROC, pt): store - "
             "files per seed set, their mean, and each route's own range (max - min over its "
             "seed sets).", "",
             "| configuration | store - files per seed set | mean | store range | files range |",
             "|---|---|---|---|---|"]
    for c in fa.configurations:
        if c.scope == "point":
            continue
        if c.samples != samples:
            continue
        rows = {lay: [run(lay, n).configuration(c.id).test["calibrated"] for n in seeds]
                for lay in ("store", "files")}
        cell = {}
        for key in ("accuracy", "ood_auroc"):
            st = [r.get(key) for r in rows["store"]]
            fi = [r.get(key) for r in rows["files"]]
            if None in st or None in fi:
                cell[key] = None
                continue
            d = [a - b for a, b in zip(st, fi)]
            cell[key] = (d, sum(d) / len(d), st, fi)

        def fmt(i: int) -> str:
            return " / ".join("-" if cell[k] is None else
                              [", ".join(f"{100 * x:+.2f}" for x in cell[k][0]),
                               f"{100 * cell[k][1]:+.2f}", pts(cell[k][2]),
                               pts(cell[k][3])][i] for k in ("accuracy", "ood_auroc"))

        lines.append(f"| {c.id} | {fmt(0)} | {fmt(1)} | {fmt(2)} | {fmt(3)} |")
    return lines + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--sample-counts", default=None,
                   help="store-all's S values, e.g. 1,2,4,8 or all (default: the exporter's, "
                        "powers of two up to --samples plus --samples)")
    p.add_argument("--ood-data", default=None)
    p.add_argument("--max-eval", type=int, default=None)
    p.add_argument("--measure", action="store_true", help="host latency and memory too")
    p.add_argument("--reuse", action="store_true", help="keep bundles already in --out")
    p.add_argument("--md", default=None, help="also write the tables here (markdown)")
    p.add_argument("--name", default=None, help="row label (default: the checkpoint path)")
    p.add_argument("--seeds", default="0,100,200",
                   help="sampler seed sets: the first for the main exports, each further one "
                        "exports head + all again in both layouts (the seed spread); sample s "
                        "of seed n uses seed n + s, so keep them >= --samples apart")
    args = p.parse_args()
    seeds = [int(t) for t in args.seeds.split(",") if t.strip()]
    if not seeds or any(abs(a - b) < args.samples for i, a in enumerate(seeds)
                        for b in seeds[:i]):
        p.error(f"--seeds: one or more integers at least --samples = {args.samples} apart")
    torch.set_num_threads(1)
    out = Path(args.out)
    ck = args.checkpoint
    ckpt = ckpt_io.load_checkpoint(ck)
    kind = posterior_kind(ckpt)
    counts = (None if args.sample_counts is None else args.sample_counts
              if args.sample_counts == "all" else
              [int(t) for t in args.sample_counts.split(",") if t.strip()])
    runs = {"store-point": dict(layout="store", scopes=("point",)),
            "store-all": dict(layout="store", scopes=("point", "head", "all"),
                              sample_counts=counts),
            "files-all": dict(layout="files", scopes=("point", "head", "all"))}
    runs = {name: dict(kw, seed=seeds[0]) for name, kw in runs.items()}
    for n in seeds[1:]:  # the seed spread: head + all at S only, both layouts
        runs[f"seed{n}/store-all"] = dict(layout="store", scopes=("head", "all"),
                                          sample_counts=[args.samples], seed=n)
        runs[f"seed{n}/files-all"] = dict(layout="files", scopes=("head", "all"), seed=n)
    wall = {}
    for name, kw in runs.items():
        if args.reuse and (out / name / "manifest.yaml").is_file():
            continue
        t0 = time.perf_counter()
        export_bundle(ck, out / name, ExportOptions(
            samples=args.samples, ood_data=args.ood_data, max_eval=args.max_eval,
            measure=args.measure and "/" not in name, force=True, **kw), progress=False,
            log=lambda *a: None)
        wall[name] = time.perf_counter() - t0
    m = {name: read_manifest(out / name) for name in runs}

    cfg = config_from_dict(ckpt["config"])
    model = ckpt_io.model_from_checkpoint(ckpt)
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)
    calib = batches(data.train, min(cfg.data.calib_samples, len(data.train)), cfg.seed,
                    batch=256)
    fp32, _ = export_point_slice(make_slice(model, 1.0, calib), list(spec.shape), "float")
    point = m["files-all"].configuration("w1.00-point").files[0].bytes
    main_runs = ("store-point", "store-all", "files-all")
    sizes = {name: bundle_bytes(out / name) for name in main_runs}
    store = {n: m[n].store.bytes for n in ("store-point", "store-all")}
    man = {n: (out / n / "manifest.yaml").stat().st_size for n in main_runs}
    uv = m["store-point"].configuration("w1.00-point").unique_values
    label = args.name or ck
    lines = [f"### {label} ({kind}{'' if uv is None else f', {uv} unique values'})", "",
             f"full-width point slice int8 .tflite: {point:,} B; fp32 full model (float "
             f"route, width 1): {len(fp32):,} B; S_max = {args.samples}; export wall "
             + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items() if k in main_runs), "",
             "| bundle | store.bin | manifest.yaml | bundle bytes | / point slice | goal | "
             "/ fp32 | goal |", "|---|---|---|---|---|---|---|---|"]
    a = sizes["store-point"] / point
    b = sizes["store-all"] / point
    rows = [("(a) store, 4 widths, point only" if kind != "pwfn" else
             f"(a)+(c) store, 4 widths, point only (PWFN, {uv} values)", "store-point",
             "<= 1.15x" + (" / <= 0.7x" if kind == "pwfn" and uv is not None and uv <= 32
                           else ""), ""),
            ("(b) store, 4 widths, point + head + all, S = "
             + ", ".join(map(str, sample_counts(args.samples, counts))), "store-all",
             "<= 1.6x", "<= 0.4x"),
            (f"files route, S = {args.samples} (version-2 style)", "files-all", "", "")]
    for text, n, goal, goal32 in rows:
        st = store.get(n)
        lines.append(f"| {text} | {'-' if st is None else f'{st:,}'} | {man[n]:,} | "
                     f"{sizes[n]:,} | {sizes[n] / point:.2f}x | {goal} | "
                     f"{sizes[n] / len(fp32):.2f}x | {goal32} |")
    lines += ["", f"(a) {a:.2f}x, (b) {b:.2f}x, (b) vs fp32 "
                  f"{sizes['store-all'] / len(fp32):.2f}x", ""]

    # store route vs files route
    test_x, _ = nhwc_inputs(data.test, args.max_eval)
    lines += ["| width | point acc store | files | diff pt | OOD AUROC diff pt | top-1 agree | "
              f"head{args.samples} acc / AUROC diff pt | all{args.samples} acc / AUROC diff pt |",
              "|---|---|---|---|---|---|---|---|"]
    fa = m["files-all"]
    sa = m["store-all"]
    for c in fa.configurations:
        if c.scope != "point":
            continue
        wk = f"{c.width:.2f}"
        s_c = sa.configuration(c.id)
        ls = _point_logits(out / "store-all", sa, c.id, test_x)
        lf = _point_logits(out / "files-all", fa, c.id, test_x)
        agree = float((ls.argmax(1) == lf.argmax(1)).mean())
        sc, fc = s_c.test["calibrated"], c.test["calibrated"]
        cells = []
        for scope in ("head", "all"):
            cid = f"w{wk}-{scope}{args.samples}"
            try:
                x1, x2 = sa.configuration(cid).test["calibrated"], \
                    fa.configuration(cid).test["calibrated"]
                cells.append(f"{_pt(x1['accuracy'], x2['accuracy'])} / "
                             f"{_pt(x1.get('ood_auroc'), x2.get('ood_auroc'))}")
            except Exception:  # noqa: BLE001 - a scope not exported
                cells.append("-")
        lines.append(f"| {c.width:g} | {sc['accuracy']:.4f} | {fc['accuracy']:.4f} | "
                     f"{_pt(sc['accuracy'], fc['accuracy'])} | "
                     f"{_pt(sc.get('ood_auroc'), fc.get('ood_auroc'))} | {100 * agree:.2f} % | "
                     f"{cells[0]} | {cells[1]} |")
    lines += ["", f"{len(test_x)} test inputs (accuracy: calibrated; AUROC: predictive-entropy "
                  f"OOD AUROC{'' if args.ood_data else ', none: no --ood-data'}); sampler seed "
                  f"{seeds[0]}", ""]
    if len(seeds) > 1:
        lines += _seed_spread(m, fa, seeds, args.samples)
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
