"""Reading a bundle: parse ``manifest.yaml`` (the safe loader only), resolve its files inside
the bundle directory and verify their size and sha256; and the manifest's YAML text for writing.

stdlib + pyyaml only.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from edge_sdk.bundle.files import PathLike, resolve_file, sha256_file
from edge_sdk.bundle.manifest import Manifest
from edge_sdk.bundle.records import MANIFEST_NAME
from edge_sdk.bundle.recovery import missing_bundle_message
from edge_sdk.errors import BundleError, ChecksumMismatchError
from edge_sdk.validation import MAX_DEPTH, got, show

# A real manifest is about 1 kB per configuration (7.5 kB for 8; a 68-configuration store
# bundle's 105 kB); pure-Python PyYAML parses 0.3-1 MB/s, so anything above 256 KiB is refused
# before it is parsed.
_MAX_MANIFEST_BYTES = 256 << 10
# The safe loader (SafeConstructor + Resolver: plain scalars, lists and mappings, never an
# object), on libyaml's C parser when PyYAML was built with it: the 105 kB manifest's events
# 197 -> 13 ms and its load 241 -> 35 ms. yaml.SafeLoader (pure Python) otherwise.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def manifest_to_yaml(manifest: Manifest) -> str:
    """The ``manifest.yaml`` text for ``manifest``, checked to read back as an equal Manifest."""
    if not isinstance(manifest, Manifest):
        raise BundleError(f"expected a Manifest, {got(manifest)}")
    try:
        data = Manifest.from_dict(manifest.to_dict()).to_dict()  # re-validate: dicts are mutable
    except BundleError as exc:
        raise BundleError(f"invalid manifest: {exc}") from None
    # ASCII output (allow_unicode=False): PyYAML's unicode mode writes U+0085 in a way it cannot
    # read back (found by the round-trip property test); escapes round-trip everything.
    # default_flow_style=None: a list or mapping of scalars on one line ([1, 8, 8, 1], a file
    # entry), everything else in block style; a store bundle's manifest is mostly such leaves
    # and its bytes count against the bundle
    body = yaml.dump(data, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None,
                     width=100)
    text = f"# edge-sdk bundle manifest (schema version {manifest.schema_version})\n{body}"
    if _parse_manifest_text(text.encode("utf-8"), MANIFEST_NAME) != manifest:
        raise BundleError("manifest does not survive a YAML round trip; refusing to write it")
    return text


class _PlainDumper(yaml.SafeDumper):
    """safe_dump that never writes anchors or aliases (shared objects are written out), since
    the reader refuses them."""

    def ignore_aliases(self, data: object) -> bool:
        return True


@dataclass
class _MappingFrame:
    keys: set[str] = field(default_factory=set)  # the keys seen
    key_next: bool = True  # whether the next node is a key (else that key's value)


def _line_column(mark: yaml.error.Mark | yaml._yaml.Mark | None) -> str:
    """``line L, column C`` (1-based) of an event's start (PyYAML's parser gives every event
    one)."""
    if mark is None:
        return "an unknown position"
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _check_events(text: str, where: str) -> None:
    """BundleError at the first YAML anchor or alias, a mapping key written twice, or nesting
    deeper than MAX_DEPTH.
    Checked on the event stream (an alias is one event there), before anything is composed:
    expanding nested aliases (a "billion laughs" bomb) is what exhausts memory, and no manifest
    needs them; PyYAML's scanner is quadratic in flow nesting (1000 levels of [ take > 1 s),
    so the stream is abandoned as soon as it gets too deep. A duplicate key is
    refused too: PyYAML keeps the last one silently, so ``temperature`` written twice would
    mean whichever a reviewer did not read."""
    depth = 0
    # one frame per open collection: a _MappingFrame for a mapping, None for a sequence; a
    # node completes at its scalar or at its collection's end
    frames: list[_MappingFrame | None] = []

    def done(scalar: yaml.ScalarEvent | None) -> None:
        frame = frames[-1] if frames else None
        if frame is None:
            return
        if frame.key_next and scalar is not None:
            if scalar.value in frame.keys:
                raise BundleError(f"{where}: duplicate key {show(scalar.value)} at "
                                  f"{_line_column(scalar.start_mark)}: a mapping may hold each "
                                  "key once")
            frame.keys.add(scalar.value)
        frame.key_next = not frame.key_next

    for event in yaml.parse(text, Loader=SAFE_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise BundleError(f"{where}: nested more than {MAX_DEPTH} levels deep "
                                  f"({_line_column(event.start_mark)})")
            frames.append(_MappingFrame() if isinstance(event, yaml.MappingStartEvent) else None)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            frames.pop()
            done(None)
        elif isinstance(event, yaml.ScalarEvent):
            done(event)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise BundleError(
                f"{where}: YAML {kind}{str(anchor)[:40]} at {_line_column(event.start_mark)}: "
                "anchors and aliases are not allowed in a manifest (write every value out)")


def _parse_manifest_text(data: bytes, where: str) -> Manifest:
    if len(data) > _MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: more than {_MAX_MANIFEST_BYTES} bytes; a manifest is a few "
                          f"kB (at most {_MAX_MANIFEST_BYTES >> 10} KiB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{where}: not valid UTF-8 (byte {exc.start})") from None
    try:
        _check_events(text, where)
        raw = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or type(exc).__name__
        raise BundleError(f"{where}: invalid YAML{at}: {problem[:200]}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise BundleError(f"{where}: invalid YAML: {str(exc)[:200]}") from None
    except BundleError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        # a scalar the constructor cannot build: an integer of more than 4300 digits (Python's
        # int-from-string limit), a timestamp such as 2024-13-45, ...
        raise BundleError(f"{where}: invalid YAML value: {str(exc)[:200]}") from None
    if not isinstance(raw, Mapping):
        raise BundleError(
            f"{where}: expected a YAML mapping at the top level, got {type(raw).__name__}"
        )
    try:
        return Manifest.from_dict(raw)
    except BundleError as exc:
        raise BundleError(f"{where}: {exc}") from None
    except RecursionError:
        raise BundleError(f"{where}: nested too deeply") from None


def verify_files(bundle_dir: PathLike, manifest: Manifest) -> None:
    """Check every file of ``manifest`` in ``bundle_dir`` (layout store: the weight store):
    inside the bundle, size and sha256."""
    root = Path(bundle_dir)
    for entry in manifest.stored_entries():
        path = resolve_file(root, entry.name)
        try:
            size = path.stat().st_size
            if size == entry.bytes:
                digest, size = sha256_file(path)
        except OSError as exc:
            raise BundleError(f"{root}: cannot read {entry.name!r}: {exc}") from None
        if size != entry.bytes:
            raise ChecksumMismatchError(
                f"{root}: file {entry.name!r} has {size} bytes, the manifest says {entry.bytes} "
                "(truncated or modified)"
            )
        if digest != entry.sha256:
            raise ChecksumMismatchError(
                f"{root}: checksum mismatch for {entry.name!r}: manifest sha256 {entry.sha256}, "
                f"file sha256 {digest} (corrupted or modified)"
            )


def read_manifest(bundle_dir: PathLike, verify: bool = True) -> Manifest:
    """Read and validate ``bundle_dir/manifest.yaml``; with ``verify``, check every file too."""
    root = Path(bundle_dir)
    if not root.exists():
        # an export killed between its two renames leaves NAME missing and the only copy in
        # .NAME.old-*: say so (never touch it here: readers do not change the directory)
        raise BundleError(missing_bundle_message(Path(os.path.abspath(root)))
                          or f"bundle directory not found: {root}")
    if not root.is_dir():
        raise BundleError(
            f"not a bundle: {root} is not a directory (expected one holding {MANIFEST_NAME})"
        )
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"not a bundle: {root} has no {MANIFEST_NAME}")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)  # never more: the size is refused anyway
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc}") from None
    manifest = _parse_manifest_text(data, str(path))
    if verify:
        verify_files(root, manifest)
    return manifest


