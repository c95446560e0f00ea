"""What verifying slice bytes at load() costs (issue 19 §2), in ms per MB of slices.

    python benchmarks/verify.py BUNDLE [--repeats 20] [--synthetic-mb 64]

Per bundle: the total time of ``read_slices`` (read each file once, size + sha256 on those bytes,
tensor shapes checked against the manifest) split into its parts, the interpreter parse check
load() adds (build, do not allocate, every slice), and ``load()`` as a whole. ``--synthetic-mb``
also times sha256 alone on that many MB of bytes already in memory (the floor of any
verification, and what a materialiser that builds slices in memory pays). Medians of
``--repeats`` runs, measured in one process; files are in the page cache after the first run,
so this is the CPU cost, not the storage's. Device side: no torch.
"""
from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import edge_sdk
from edge_sdk.backends import check_parses, interpreter_class
from edge_sdk.bundle import check_slice, read_manifest, read_slices, verify_bytes
from timing import median_ms  # benchmarks/, the script's directory




def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--synthetic-mb", type=int, default=64)
    args = p.parse_args()
    root = Path(args.bundle)
    m = read_manifest(root, verify=False)
    entries = m.file_entries()
    mb = sum(e.bytes for e in entries) / 1e6
    blobs = read_slices(root, m)
    cls, backend = interpreter_class()

    def read_only():
        for e in entries:
            with open(root / e.name, "rb") as f:
                f.read()

    def sha_only():
        for e in entries:
            verify_bytes(blobs[e.name], e)

    def shapes_only():
        for c in m.configurations:
            for e in c.files:
                check_slice(blobs[e.name], e.name, c, m.input, m.batch_dim)

    rows = [("read files (no check)", median_ms(read_only, args.repeats)),
            ("size + sha256 on the bytes", median_ms(sha_only, args.repeats)),
            ("tensor shapes vs manifest", median_ms(shapes_only, args.repeats)),
            ("read_slices (all of the above)", median_ms(lambda: read_slices(root, m),
                                                          args.repeats)),
            (f"interpreter parse check ({backend})", median_ms(lambda: check_parses(cls, blobs),
                                                               args.repeats)),
            ("load() as a whole", median_ms(lambda: edge_sdk.load(root, profile=None),
                                             args.repeats))]
    print(f"bundle {root}: {len(entries)} files, {mb:.3f} MB; host {os.cpu_count()} CPUs; "
          f"median of {args.repeats}")
    print(f"{'step':<40} {'ms':>9} {'ms/MB':>9}")
    for name, ms in rows:
        print(f"{name:<40} {ms:9.3f} {ms / mb:9.2f}")
    if args.synthetic_mb:
        blob = os.urandom(args.synthetic_mb << 20)
        ms = median_ms(lambda: hashlib.sha256(blob).hexdigest(), max(3, args.repeats // 4))
        print(f"{'sha256 of in-memory bytes':<40} {ms:9.3f} "
              f"{ms / (len(blob) / 1e6):9.2f}  ({args.synthetic_mb} MiB)")


if __name__ == "__main__":
    main()
