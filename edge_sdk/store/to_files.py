"""A store bundle written out as a ``files`` bundle (``edge-sdk materialize``): every slice
materialised once from the verified store, verified, and written atomically with a manifest
that lists the same files (so the same sha256 per file) without the store.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from edge_sdk.bundle.manifest import Manifest
from edge_sdk.bundle.reading import read_manifest
from edge_sdk.bundle.records import SIGNATURE_NAME
from edge_sdk.bundle.slices import read_verified
from edge_sdk.bundle.writing import write_bundle
from edge_sdk.errors import BundleError, SignatureError
from edge_sdk.store.sources import StoreSlices, layout_of
from edge_sdk.trust.signing import read_trusted_manifest, signer

if TYPE_CHECKING:
    from edge_sdk.bundle.files import PathLike
    from edge_sdk.trust.signing import KeyLike

__all__ = ["files_manifest", "materialize_bundle"]


def files_manifest(manifest: Manifest) -> Manifest:
    """The ``layout: files`` manifest of a store bundle's slices: the same configurations and
    file entries (so the same sha256 per file), without the store, the graphs and the recipes,
    and ``source.materialized_from`` naming the store it came from (provenance; nothing
    checks it)."""
    data = manifest.to_dict(expand=True)  # file entries in every configuration
    store = data.pop("store")
    data.pop("graphs", None)
    data.pop("slices", None)
    data["layout"] = "files"
    data["source"] = {**data.get("source", {}), "materialized_from": {
        "store": store["name"], "sha256": store["sha256"], "bytes": store["bytes"]}}
    for c in data["configurations"]:
        c.pop("materialize", None)
    return Manifest.from_dict(data)


def materialize_bundle(bundle_dir: PathLike, out_dir: PathLike, *, force: bool = False,
                       key: KeyLike | None = None,
                       trusted_keys: Iterable[KeyLike] | KeyLike | None = None
                       ) -> tuple[Path, dict[str, float]]:
    """Write the ``files`` bundle of store bundle ``bundle_dir`` at ``out_dir`` (``edge-sdk
    materialize``): every file materialised once from the verified store and verified (sha256
    == the store manifest's, tensors), then written atomically (:func:`write_bundle`, which
    checks every sha256 again). Returns (the bundle path, ms per file).

    Signed bundles: ``trusted_keys`` verifies the store bundle's signature first;
    ``key`` signs the written bundle inside the same atomic write. A signed store bundle is
    never materialised unsigned: its signature covers the store manifest, not the new one,
    so without ``key`` it is refused (SignatureError) before anything is written."""
    if trusted_keys is not None:
        manifest = read_trusted_manifest(bundle_dir, trusted_keys)
    else:
        manifest = read_manifest(bundle_dir, verify=False)
    signed = (Path(bundle_dir) / SIGNATURE_NAME).exists()
    if signed and key is None:
        raise SignatureError(f"{bundle_dir} is signed and its signature cannot cover the "
                             "materialised bundle's new manifest: pass --key (key=) to sign the "
                             "new bundle, or nothing is written")
    sign = None if key is None else signer(key)  # a bad key fails before any work
    if layout_of(manifest) != "store":
        raise BundleError(f"{bundle_dir}: already a files bundle (layout "
                          f"{layout_of(manifest)!r}, schema version {manifest.schema_version}): "
                          f"its .tflite files are in the directory, nothing to materialise")
    source = StoreSlices.read(bundle_dir, manifest, cap_bytes=0)
    files = {name: source.build(name) for name in source.names()}  # build: nothing cached
    if manifest.uncertainty is not None:  # the same verified file in both layouts
        files[manifest.uncertainty.name] = read_verified(bundle_dir, manifest.uncertainty)
    out = write_bundle(out_dir, files_manifest(manifest), files, force=force, sign=sign)
    return out, dict(source.materialize_ms)
