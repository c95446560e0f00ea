"""TFLite interpreter backends: LiteRT (``ai-edge-litert``, a base dependency where it has wheels)
and ``tflite-runtime`` (2.14, with numpy < 2).

Which one runs: ``load(..., backend=...)``, else the ``EDGE_SDK_BACKEND`` environment variable,
else ``auto`` = the first installed of LiteRT, tflite-runtime. With none usable, the first
``load()`` raises :class:`BackendError` in one line saying what to install.

A backend is also refused for a bundle it is known to compute wrongly, rather than letting it
answer: :func:`check_bundle` reads the operators of every file (:mod:`edge_sdk.tflite.model_info`) against
:data:`KNOWN_WRONG`. And a model its op resolver does not know (a too-new op version) fails at
interpreter creation as a :class:`BackendError` naming the file, not as a bare ``ValueError``.

The class :func:`interpreter_class` returns is the backend's own with three changes: those
typed errors, ``set_tensor`` / ``invoke`` / ``get_tensor`` bound straight to the compiled
wrapper (the hot path), and no reference-count check before a resize, allocation
or invoke (it guards ``tensor()`` views, which the runtime never takes).

Imports: edge_sdk.errors, edge_sdk.tflite, edge_sdk.bundle.
"""
from __future__ import annotations

import base64
import difflib
import importlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_sdk.tflite.model_info import FULLY_CONNECTED, OpInfo, read_ops
from edge_sdk.errors import AllocationError, EdgeSdkError

if TYPE_CHECKING:  # edge_sdk.bundle imports the runtime's pieces; only its types here
    from edge_sdk.bundle.manifest import Manifest

ENV_VAR = "EDGE_SDK_BACKEND"
BACKENDS = ("litert", "tflite-runtime")  # the order ``auto`` tries them in
_MODULES = {"litert": "ai_edge_litert", "tflite-runtime": "tflite_runtime"}
_ALIASES = {"ai-edge-litert": "litert", "tflite": "tflite-runtime"}
# what to install, from the wheels each project publishes (checked for ai-edge-litert 2.3.0 and
# tflite-runtime 2.14.0)
INSTALL = {
    "litert": "pip install ai-edge-litert==2.3.0 (wheels for Linux x86_64/aarch64, macOS arm64, "
              "Windows amd64; Python 3.10-3.14)",
    "tflite-runtime": "pip install tflite-runtime==2.14.0 'numpy<2' (wheels for Linux "
                      "x86_64/aarch64; Python <= 3.11)",
}


class BackendError(EdgeSdkError):
    """No usable TFLite interpreter, or a model the chosen one cannot run correctly."""


def _hybrid_per_channel_fully_connected(op: OpInfo) -> bool:
    x, w = (op.inputs + (None, None))[:2]
    return (op.code == FULLY_CONNECTED and x is not None and w is not None
            and x.type == "float32" and w.type == "int8" and w.scales > 1)


# (backend, which operators, why): measured, not guessed (tests/edge_sdk/test_backends.py keeps
# the measurement). tflite-runtime 2.14.0's hybrid FULLY_CONNECTED (int8 per-channel weights, float
# activations; the exporter's --weights hybrid) answers with errors as large as the outputs at op
# versions below 11, and its op resolver stops at version 10, so the correct marking (12) does not
# load. LiteRT 2.3.0 computes it correctly at every version.
KNOWN_WRONG: tuple[tuple[str, Callable[[OpInfo], bool], str], ...] = (
    ("tflite-runtime", _hybrid_per_channel_fully_connected,
     "FULLY_CONNECTED with per-channel int8 weights on float inputs (--weights hybrid), which "
     "tflite-runtime 2.14 computes wrongly below op version 11 and cannot load from version 11 on"),
)


def resolve_name(backend: str | None = None) -> str:
    """``auto`` or a backend name, from ``backend``, else ``EDGE_SDK_BACKEND``, else ``auto``."""
    source = "backend"
    if backend is None:
        backend, source = os.environ.get(ENV_VAR, "").strip() or "auto", ENV_VAR
    if not isinstance(backend, str):
        raise BackendError(f"backend must be a string (auto, {', '.join(BACKENDS)}), got "
                           f"{type(backend).__name__}")
    name = backend.strip().lower().replace("_", "-")
    name = _ALIASES.get(name, name)
    if name == "auto" or name in BACKENDS:
        return name
    close = difflib.get_close_matches(name, ("auto",) + BACKENDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise BackendError(f"{source} must be auto, {' or '.join(BACKENDS)}, got {backend!r}{hint}")


def _installed(name: str) -> bool:
    return importlib.util.find_spec(_MODULES[name]) is not None


def _import(name: str) -> Any:
    """The backend's Interpreter class; BackendError (one line) when it cannot be used here."""
    module = _MODULES[name]
    if not _installed(name):
        raise BackendError(f"{name} is not installed: {INSTALL[name]}")
    if name == "tflite-runtime":
        # tflite-runtime is built against NumPy 1.x: next to numpy 2 its import fails after a
        # screenful of warnings, so say why before trying
        import numpy

        if int(numpy.__version__.split(".")[0]) >= 2:
            raise BackendError(f"tflite-runtime needs numpy < 2 (built against NumPy 1.x), found "
                               f"numpy {numpy.__version__}: pip install 'numpy<2'")
    try:
        return importlib.import_module(f"{module}.interpreter").Interpreter
    except (ImportError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(f"{name} is installed but does not import ({first}): "
                           f"{INSTALL[name]}") from e


# The XNNPACK delegate logs "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." to fd 2 (from
# C++; TF_CPP_MIN_LOG_LEVEL does not reach it, measured) once per process, at the first
# allocate_tensors(). quiet_delegate_banner() spends that once on this one-operator model
# (y = x + x, 448 bytes, written by exporters.tflite.GraphBuilder) with fd 2 captured.
_BANNER = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
_ONE_OP_MODEL = base64.b64decode(
    "HAAAAFRGTDMUABwAGAAUABAADAAIAAAAAAAEABQAAAAYAAAAkAAAAJgAAACcAAAAgAEAAAMAAAABAAAAEAAAAAAA"
    "CgAQAAwACAAEAAoAAAAMAAAAHAAAADwAAAAPAAAAc2VydmluZ19kZWZhdWx0AAEAAAAMAAAACAAMAAgABAAIAAAA"
    "AQAAAAQAAAABAAAAeQAAAAEAAAAMAAAAAAAGAAgABAAGAAAABAAAAAEAAAB4AAAAAQAAAAQAAAAE////AAAAAAAA"
    "AAABAAAAFAAAAAAADgAYABQAEAAMAAgABAAOAAAAFAAAABwAAABcAAAAYAAAAGQAAAAEAAAAbWFpbgAAAAABAAAA"
    "FAAAAAAADgAUAAAAEAAMAAsABAAOAAAAEAAAAAAAAAsMAAAAEAAAAHj///8BAAAAAQAAAAIAAAAAAAAAAAAAAAEA"
    "AAABAAAAAQAAAAAAAAACAAAANAAAAAQAAADg////CAAAAAwAAAABAAAAeQAAAAIAAAABAAAAAQAAAAwADAAIAAAA"
    "AAAEAAwAAAAIAAAADAAAAAEAAAB4AAAAAgAAAAEAAAABAAAAAQAAAAgAAAAEAAQABAAAAA==")
_quieted: set[str] = set()
_quiet_lock = threading.Lock()


def quiet_delegate_banner(cls: Any) -> None:
    """Create and allocate a throwaway interpreter of ``cls`` with fd 2 captured, once per
    process and backend module, so the delegate's INFO line is not printed on every CLI call;
    anything else written to fd 2 meanwhile is passed on. Best effort: never raises."""
    with _quiet_lock:
        if cls.__module__ in _quieted:
            return
        _quieted.add(cls.__module__)
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no fd 2 (e.g. pythonw): nothing printed
            return
        with tempfile.TemporaryFile() as captured:
            try:
                os.dup2(captured.fileno(), 2)
                try:
                    cls(model_content=_ONE_OP_MODEL, num_threads=1).allocate_tensors()
                except Exception:  # a backend that cannot run it has nothing to quieten
                    pass
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            rest = captured.read().replace(_BANNER, b"")
        while rest:
            rest = rest[os.write(2, rest):]


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())  # one line, whatever the interpreter printed
    return text[:300] if text else type(e).__name__


def _guarded(cls: Any, name: str) -> Any:
    """``cls`` whose construction turns the op resolver's ValueError (an op or op version this
    backend does not know) into a one-line BackendError naming the file."""
    quiet_delegate_banner(cls)

    # the backend's Interpreter class, known only at run time (no stubs: typed Any)
    class Interpreter(cls):  # type: ignore[misc]  # subclassing Any: see above
        def __init__(self, *args: Any, model_name: str | None = None, **kwargs: Any) -> None:
            # model_name: what to call a model given as bytes (model_content=) in errors
            self._edge_sdk_name = model_name or (
                Path(kwargs["model_path"]).name if kwargs.get("model_path") else "a model")
            try:
                super().__init__(*args, **kwargs)
            except ValueError as e:
                raise BackendError(f"{name} cannot run {self._edge_sdk_name}: "
                                   f"{_first_line(e)}") from e
            # the hot path calls the compiled wrapper's own methods: the Python
            # methods of both backends only forward to them (invoke after _ensure_safe), and
            # each Python frame costs ~0.1-0.3 us per call, more after a wide invoke has
            # evicted the caches. Bound here, as instance attributes, so a caller (a test, a
            # benchmark's timer) can still wrap them per interpreter.
            wrapper: Any = getattr(self, "_interpreter", None)
            if all(hasattr(wrapper, m) for m in ("SetTensor", "Invoke", "GetTensor")):
                self.set_tensor = wrapper.SetTensor
                self.invoke = wrapper.Invoke
                self.get_tensor = wrapper.GetTensor

        def _safe_to_run(self) -> bool:
            # The backends refuse allocate/resize/invoke while a numpy view of the
            # interpreter's memory (from tensor()) is alive, by counting references to the
            # wrapper; the bound methods above hold three more. The runtime never takes such a
            # view (it reads with get_tensor, a copy), so there is nothing to refuse.
            return True

        def __del__(self) -> None:
            # the wrapper must go before the delegates it uses (the backends' own __del__):
            # drop the references the bound methods hold first
            for m in ("set_tensor", "invoke", "get_tensor"):
                self.__dict__.pop(m, None)
            super().__del__()

        # the interpreter's RuntimeError at allocation (an operator index out of
        # range, a reshape that cannot hold, ...) is a typed refusal naming the file, not a raw
        # exception at the first predict; invoke() stays unwrapped (the hot path)
        def allocate_tensors(self) -> None:
            try:
                super().allocate_tensors()
            except (RuntimeError, ValueError) as e:
                raise AllocationError(f"{name} cannot allocate {self._edge_sdk_name}: "
                                 f"{_first_line(e)}") from None

        def resize_tensor_input(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().resize_tensor_input(*args, **kwargs)
            except (RuntimeError, ValueError) as e:
                raise AllocationError(f"{name} cannot resize the input of {self._edge_sdk_name}: "
                                 f"{_first_line(e)}") from None

    Interpreter.__qualname__ = Interpreter.__name__ = cls.__name__
    Interpreter.__module__ = cls.__module__
    return Interpreter


def interpreter_class(backend: str | None = None) -> tuple[Any, str]:
    """(Interpreter class, backend name) of the chosen backend: ``backend``, else
    ``EDGE_SDK_BACKEND``, else (``auto``) the first of LiteRT, tflite-runtime that is usable."""
    choice = resolve_name(backend)
    if choice != "auto":
        return _guarded(_import(choice), choice), choice
    reasons = []
    for name in BACKENDS:
        try:
            return _guarded(_import(name), name), name
        except BackendError as e:
            reasons.append(str(e) if _installed(name) else f"{name} is not installed")
    raise BackendError("no usable TFLite interpreter: " + "; ".join(reasons) + ". Install one: "
                       + "; or ".join(INSTALL.values()) + " (docs/runtime.md, 'Backends')")


def available() -> list[str]:
    """The backends that are installed (not necessarily importable), in ``auto`` order."""
    return [name for name in BACKENDS if _installed(name)]


def usable() -> list[str]:
    """The backends whose interpreter imports and works here, in ``auto`` order (tests run
    each of them)."""
    out = []
    for name in BACKENDS:
        try:
            interpreter_class(name)
        except BackendError:
            continue
        out.append(name)
    return out


def unrunnable(path: str | Path, backend: str) -> list[str]:
    """Why ``backend`` cannot run the model at ``path`` correctly (empty: nothing known).
    Reads the file only when a rule exists for this backend."""
    if not any(b == backend for b, _, _ in KNOWN_WRONG):
        return []
    return unrunnable_bytes(Path(path).read_bytes(), Path(path).name, backend)


def unrunnable_bytes(data: bytes, name: str, backend: str) -> list[str]:
    """:func:`unrunnable` for a model given as bytes (``name`` for errors)."""
    rules = [(match, why) for b, match, why in KNOWN_WRONG if b == backend]
    if not rules:
        return []
    found = []
    for op in read_ops(data, name):
        for match, why in rules:
            if match(op) and f"{why} (here version {op.version})" not in found:
                found.append(f"{why} (here version {op.version})")
    return found


def check_parses(interp_cls: Any, blobs: Mapping[str, bytes]) -> None:
    """Build and allocate an interpreter of ``interp_cls`` (from :func:`interpreter_class`)
    from every slice, so a model the backend's flatbuffer verifier, op resolver or allocation
    refuses fails at ``load()`` as a BackendError or SliceError naming the file, not at the
    first predict."""
    for name, data in blobs.items():
        _build_and_allocate(interp_cls, data, name)


def _build_and_allocate(interp_cls: Any, data: bytes, name: str) -> None:
    """Build and allocate (at ``load()``, inside the typed wrapper, so what the
    interpreter refuses at allocation is a SliceError now, never at the first predict)."""
    interp_cls(model_content=data, num_threads=1, model_name=name).allocate_tensors()


def check_bundle(bundle_dir: str | os.PathLike[str], manifest: Manifest, backend: str,
                 blobs: Mapping[str, bytes] | None = None, interp_cls: Any = None,
                 stand_ins: dict[str, str] | None = None) -> dict[str, str]:
    """The configurations ``backend`` would answer wrongly (id -> why), which the runtime then
    leaves out (a dynamic-range variant on tflite-runtime 2.14: its float and integer variants
    answer); BackendError, naming them and what to do instead, when that leaves none. ``blobs`` (name -> verified bytes, from
    :func:`edge_sdk.bundle.read_slices`): inspect those instead of reading the files; with
    ``interp_cls`` too, every slice must also parse (:func:`check_parses`). ``stand_ins``
    (file name -> a name in ``blobs``): a store bundle checks one materialised slice per
    distinct graph, which stands for the files that differ from it only in weight values
    (:mod:`edge_sdk.store.sources`)."""
    if stand_ins is not None and blobs is not None and interp_cls is not None:
        # one pass, each checked slice looked up once (a store bundle materialises it on
        # lookup, under its memory cap): its known-wrong rules, then (if none) its parse
        known: dict[str, list[str]] = {}
        for name, data in blobs.items():
            known[name] = unrunnable_bytes(data, name, backend)
            if not known[name]:  # a slice left out is not built
                _build_and_allocate(interp_cls, data, name)
        return _check_known_wrong(bundle_dir, manifest, backend, blobs, stand_ins, known)
    out = _check_known_wrong(bundle_dir, manifest, backend, blobs, stand_ins)
    if blobs is not None and interp_cls is not None:
        # after the known-wrong rules: their message says more than the op resolver's
        left_out = {f.name for c in manifest.configurations if c.id in out for f in c.files}
        check_parses(interp_cls, {n: b for n, b in blobs.items() if n not in left_out})
    return out


def _check_known_wrong(bundle_dir: str | os.PathLike[str], manifest: Manifest, backend: str,
                       blobs: Mapping[str, bytes] | None,
                       stand_ins: dict[str, str] | None = None,
                       known: dict[str, list[str]] | None = None) -> dict[str, str]:
    """``known``: reasons already found per checked name (a name missing from it: none)."""
    if not any(b == backend for b, _, _ in KNOWN_WRONG):
        return {}
    from edge_sdk.bundle.files import resolve_file

    def reasons_for(name: str) -> list[str]:
        if known is not None:
            return known.get(name, [])
        if blobs is None:
            return unrunnable(resolve_file(bundle_dir, name), backend)
        return unrunnable_bytes(blobs[name], name, backend)

    bad: dict[str, list[str]] = {}
    reasons: dict[str, list[str]] = {}  # by the name of the bytes inspected: each looked up once
    for c in manifest.configurations:
        for f in c.files:
            name = f.name if stand_ins is None else stand_ins.get(f.name, f.name)
            if name not in reasons:
                reasons[name] = reasons_for(name)
            for why in reasons[name]:
                bad.setdefault(why, [])
                if c.id not in bad[why]:
                    bad[why].append(c.id)
    out = {cid: why for why, ids in bad.items() for cid in ids}
    if bad and len(out) == len(manifest.configurations):
        why, ids = next(iter(bad.items()))
        others = [b for b in BACKENDS if b != backend]
        raise BackendError(
            f"{bundle_dir}: backend {backend} cannot run configuration(s) {', '.join(ids)} "
            f"correctly: {why}; load it with backend={others[0]!r} ({ENV_VAR}={others[0]}) or "
            f"re-export with --weights dequantize")
    return out
