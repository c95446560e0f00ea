"""Where the runtime's slice bytes come from, for both bundle layouts (docs/store.md).

An interpreter is only ever built from bytes this module hands out, and it hands out verified
bytes only. Two sources, one interface (``source[name] -> bytes``):

- :class:`FileSlices` (layout ``files``, and every version-1/2 bundle): every ``.tflite`` file
  read once at ``load()``, size + sha256 + tensors checked (:func:`read_slices`), kept in memory.
- :class:`StoreSlices` (layout ``store``): ``store.bin`` read once at ``load()``, size + sha256
  checked on those bytes, decoded once; a slice is materialised from that in-memory store the
  first time it is asked for (``edge_sdk.store.materialize_file``), then its sha256 must equal
  the manifest's (the device built byte for byte what the exporter measured) and its tensors
  must be the manifest's (:func:`check_slice`), before anyone sees it. Materialised bytes are
  kept in an LRU cache bounded by ``cap_bytes`` (the runtime's ``memory_cap_mb``); an evicted
  slice is materialised again from the verified store, and verified again.

Thread-safe: one lock guards the cache; a slice wanted by several threads at once is
materialised by the first of them while the others wait for its result (never twice at once).

What ``load()`` checks through :meth:`SliceSource.load_check`: the files layout hands over every
slice (each parses with the backend, as before). A store bundle hands over one *representative*
per distinct graph: per width, the point slice, one sampled slice of the ``all`` scope and the
head slice with the most heads. The others of a group differ only in weight values (another
seed, fewer stacked heads), which is what the sha256 check at first use covers; their operators
and tensor types are the representative's, so the backend's parse and known-wrong checks on the
representative stand for them (``stand_ins``). The representatives stay in the cache: the point
slices are what a first call runs anyway.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edge_sdk.bundle.manifest import Manifest
from edge_sdk.bundle.files import PathLike, resolve_file
from edge_sdk.bundle.slices import _read_once, check_slice, read_slices, verify_bytes
from edge_sdk.errors import BundleError, EdgeSdkError

if TYPE_CHECKING:  # numpy: imported at run time for store bundles alone
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.bundle.records import Recipe, StoreEntry
    from edge_sdk.store.container import Store

__all__ = ["FileSlices", "SliceSource", "StoreSlices", "layout_of", "open_slices", "read_store",
           "representatives"]

MB = 2 ** 20
# what a broken store or recipe raises from numpy / struct / the writer: reported as a
# BundleError naming the file, not as a traceback from deep inside the decoder
_DECODE_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, AttributeError,
                  EdgeSdkError)


def layout_of(manifest: Manifest) -> str:
    """``"store"`` or ``"files"`` (versions 1 and 2 have no ``layout``: files)."""
    return getattr(manifest, "layout", None) or "files"


class SliceSource:
    """Verified slice bytes by file name (see the module docstring)."""

    layout: str = "files"

    def __getitem__(self, name: str) -> bytes:
        raise NotImplementedError

    def names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def load_check(self) -> tuple[Mapping[str, bytes], dict[str, str] | None]:
        """(name -> verified bytes the backend must parse at ``load()``, file name -> the name
        of the checked file that stands in for it, or None: every file is checked itself)."""
        raise NotImplementedError

    def resident(self) -> tuple[str, ...]:
        """The names whose bytes are in memory now."""
        return self.names()


class FileSlices(SliceSource):
    """Every file of a ``files`` bundle, read and verified at construction (:func:`read_slices`)."""

    layout = "files"

    def __init__(self, blobs: Mapping[str, bytes]):
        self._blobs = dict(blobs)

    @classmethod
    def read(cls, bundle_dir: PathLike, manifest: Manifest) -> FileSlices:
        return cls(read_slices(bundle_dir, manifest))

    def __getitem__(self, name: str) -> bytes:
        return self._blobs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._blobs

    def names(self) -> tuple[str, ...]:
        return tuple(self._blobs)

    def load_check(self) -> tuple[dict[str, bytes], None]:
        """Every file (already in memory): the known-wrong rules on all of them before any
        interpreter is built, then every parse (``check_bundle`` without stand-ins)."""
        return dict(self._blobs), None


def _store_entry(root: Path, manifest: Manifest) -> StoreEntry:
    """``manifest.store``, which a layout-store manifest always names (its parser checks)."""
    if manifest.store is None:
        raise BundleError(f"{root}: the manifest names no weight store (layout 'store')")
    return manifest.store


def read_store(bundle_dir: PathLike, manifest: Manifest) -> Store:
    """The decoded store of a ``store`` bundle: ``store.bin`` read once, its size and sha256
    checked on those very bytes against ``manifest.store``, then decoded (``decode_store``; a
    compressed store, container version 2, is inflated only after that check, so nothing
    unverified reaches zlib). BundleError naming the file for a missing, truncated, modified
    or undecodable store."""
    # through the package, where a test may stand in for it; numpy only, loaded for store bundles
    from edge_sdk.store import decode_store

    root = Path(bundle_dir)
    entry = _store_entry(root, manifest)
    data = _read_once(resolve_file(root, entry.name), entry, root)
    verify_bytes(data, entry, str(root))
    try:
        return decode_store(data)
    except BundleError as exc:
        raise BundleError(f"{root}: {entry.name}: {exc}") from None
    except _DECODE_ERRORS as exc:
        raise BundleError(f"{root}: {entry.name} does not decode as a weight store "
                          f"({type(exc).__name__}: {exc})") from None


def recipe_fields(recipe: Recipe | Mapping[str, Any]) -> tuple[str, int | None, int]:
    """(width key, sample or None, heads) of one materialisation recipe (a record or a dict)."""
    if isinstance(recipe, Mapping):
        return str(recipe["width"]), recipe.get("sample"), int(recipe.get("heads") or 0)
    return str(recipe.width), getattr(recipe, "sample", None), int(getattr(recipe, "heads", 0) or 0)


def representatives(manifest: Manifest) -> dict[str, str]:
    """file name -> the file that stands in for it at ``load()``: per width and weight route,
    the point slice, the lowest sample of the sampled slices, the head slice with the most
    heads (see the module docstring for why one per group is enough)."""
    best: dict[tuple[str, str, str], tuple[tuple[int, int, str], str]] = {}
    group_of: dict[str, tuple[str, str, str]] = {}
    for c in manifest.configurations:
        if c.materialize is None:
            raise BundleError(f"configuration {c.id} of a layout-store manifest has no "
                              f"materialize recipes")
        for f, recipe in zip(c.files, c.materialize):
            width, sample, heads = recipe_fields(recipe)
            kind = "head" if heads else ("point" if sample is None else "sample")
            group = (width, kind, c.weights)  # each route its own kernels: its own check
            rank = (-heads, sample if sample is not None else -1, f.name)
            group_of[f.name] = group
            if group not in best or rank < best[group][0]:
                best[group] = (rank, f.name)
    return {name: best[group][1] for name, group in group_of.items()}


class _Pending:
    """A materialisation in flight: the threads that want the same slice wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None


class StoreSlices(SliceSource):
    """Slices of a ``store`` bundle, materialised on first use from the verified store.

    ``cap_bytes``: the most materialised bytes kept (LRU; None: no bound, every slice used stays,
    as every file of a ``files`` bundle does). The slice just made is always kept, so a cap
    below one slice still works (each call then materialises it again, and says so in
    :attr:`materialize_ms`)."""

    layout = "store"

    def __init__(self, store: Store, manifest: Manifest, where: str = "",
                 cap_bytes: float | None = None,
                 materialize: Callable[[Store, Manifest, Configuration, int], bytes] | None = None
                 ) -> None:
        if materialize is None:
            from edge_sdk.store import materialize_file

            materialize = materialize_file
        self._store, self._manifest, self._where = store, manifest, where
        self._materialize: Callable[[Store, Manifest, Configuration, int], bytes] = materialize
        self.cap_bytes = cap_bytes
        self._recipes: dict[str, tuple[Configuration, int]] = {}
        for c in manifest.configurations:
            for i, f in enumerate(c.files):
                self._recipes.setdefault(f.name, (c, i))
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        # file name -> ms of its last materialisation + verification; and how many there were
        self.materialize_ms: dict[str, float] = {}
        self.materialized = 0
        self._stand_ins = representatives(manifest)

    @classmethod
    def read(cls, bundle_dir: PathLike, manifest: Manifest, cap_bytes: float | None = None
             ) -> StoreSlices:
        return cls(read_store(bundle_dir, manifest), manifest, str(bundle_dir), cap_bytes)

    @property
    def store(self) -> Store:
        return self._store

    def names(self) -> tuple[str, ...]:
        return tuple(self._recipes)

    def __contains__(self, name: object) -> bool:
        return name in self._recipes

    def resident(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._cache)

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(map(len, self._cache.values()))

    def __getitem__(self, name: str) -> bytes:
        if name not in self._recipes:
            raise KeyError(name)
        with self._lock:
            data = self._cache.get(name)
            if data is not None:
                self._cache.move_to_end(name)
                return data
            pending = self._pending.get(name)
            owner = pending is None
            if pending is None:
                pending = self._pending[name] = _Pending()
        if not owner:
            pending.done.wait()
            if isinstance(pending.error, BundleError):  # each waiter its own exception
                raise BundleError(str(pending.error))
            if pending.error is not None:
                raise pending.error
            if pending.data is None:  # the owner sets data or error before done
                raise BundleError(f"materialising {name!r}: no result")
            return pending.data
        try:
            pending.data = built = self.build(name)
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            with self._lock:
                del self._pending[name]
                if pending.error is None:
                    self._keep(name, built)  # build returned (else error is set)
            pending.done.set()
        return built

    def build(self, name: str) -> bytes:
        """Materialise ``name`` and verify it (sha256 and size against the manifest, tensors
        against its configuration); nothing cached. BundleError naming the file otherwise."""
        config, i = self._recipes[name]
        entry = config.files[i]
        at = f"{self._where}: " if self._where else ""
        t0 = time.perf_counter()
        try:
            data = self._materialize(self._store, self._manifest, config, i)
        except BundleError as exc:
            raise BundleError(f"{at}materialising {name!r}: {exc}") from None
        except _DECODE_ERRORS as exc:
            raise BundleError(f"{at}materialising {name!r} from the store failed "
                              f"({type(exc).__name__}: {exc})") from None
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BundleError(f"{at}materialising {name!r} gave {type(data).__name__}, not bytes")
        data = bytes(data)
        try:
            verify_bytes(data, entry, self._where)
        except BundleError as exc:
            raise BundleError(f"materialised {exc} (the device did not build the bytes the "
                              f"exporter measured: a store, sampler or writer mismatch)") from None
        check_slice(data, name, config, self._manifest.input, self._manifest.batch_dim,
                    self._where)
        self.materialize_ms[name] = (time.perf_counter() - t0) * 1e3
        self.materialized += 1
        return data

    def _keep(self, name: str, data: bytes) -> None:
        """Cache ``data`` as most recently used, then evict least recently used slices until
        the cache fits ``cap_bytes`` (never the one just made). Under ``self._lock``."""
        self._cache[name] = data
        self._cache.move_to_end(name)
        if self.cap_bytes is None:
            return
        total = sum(map(len, self._cache.values()))
        while total > self.cap_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            total -= len(old)

    def load_check(self) -> tuple[Mapping[str, bytes], dict[str, str]]:
        """The representatives as a lazy mapping: each materialised and verified when first
        looked up, held by the LRU cache only, so checking them at ``load()`` never holds more
        than ``cap_bytes`` (and the one being checked) at once."""
        return _Lazy(self, tuple(dict.fromkeys(self._stand_ins.values()))), \
            dict(self._stand_ins)


class _Lazy(Mapping[str, bytes]):
    """``names`` -> ``source[name]``, looked up on access (nothing held here)."""

    def __init__(self, source: StoreSlices, names: tuple[str, ...]):
        self._source, self._names = source, names

    def __getitem__(self, name: str) -> bytes:
        if name not in self._names:
            raise KeyError(name)
        return self._source[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def open_slices(bundle_dir: PathLike, manifest: Manifest,
                memory_cap_mb: float | None = None) -> SliceSource:
    """The slice source of a bundle, by its layout; everything it will ever hand out is
    verified (see the module docstring). ``memory_cap_mb`` bounds a store bundle's cache of
    materialised bytes."""
    if layout_of(manifest) == "store":
        cap = None if memory_cap_mb is None else memory_cap_mb * MB
        return StoreSlices.read(bundle_dir, manifest, cap)
    return FileSlices.read(bundle_dir, manifest)
