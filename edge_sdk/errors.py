"""Typed errors. Every message names what was wrong and what was expected.

All derive from :class:`EdgeSdkError` (and from ``ValueError`` where the cause is a
bad value) so callers can catch one family without parsing messages.
"""
from __future__ import annotations


class EdgeSdkError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(EdgeSdkError, ValueError):
    """A configuration key, type or value is not allowed: also every invalid value of an
    argument of ``edge_sdk.load()`` (one type per argument, whatever is wrong with the value;
    :class:`ProfileError` and :class:`SigningKeyError`, named for what ``profile`` and
    ``trusted_keys`` point at, are ConfigErrors too). A per-call budget is a
    :class:`BudgetError`; what a valid argument points at can still be broken (the bundle:
    :class:`BundleError`; a backend not installed: ``BackendError``)."""


class DataError(EdgeSdkError, ValueError):
    """A data source is missing, malformed or inconsistent."""


class CheckpointError(EdgeSdkError, ValueError):
    """A checkpoint file is missing, corrupt or of an unknown format."""


class InputError(EdgeSdkError, ValueError):
    """An input passed to the runtime has the wrong shape, dtype or values."""


class BundleError(EdgeSdkError, ValueError):
    """A bundle directory or its manifest is invalid."""


class InputSpecError(BundleError, DataError):
    """An input spec is malformed: the manifest's ``input`` (a bundle problem) or the one the
    training data gave and a checkpoint carries (a data problem), so it is both."""


class InputSpecMismatchError(DataError):
    """Data reloaded for a checkpoint (or bundle) do not match the input spec it carries:
    another shape, dtype, value range, normalisation or class list. Names both values."""


class BudgetError(EdgeSdkError, ValueError):
    """A budget is invalid, or (strict mode) cannot be met."""


class BudgetNotMetError(BudgetError):
    """Strict mode: a valid budget that no configuration is predicted to meet (the CLI's exit
    code 3, where an invalid budget is 2). Names the shortfall: milliseconds or megabytes."""


class ProfileError(ConfigError):
    """A device profile is missing, malformed or fails its schema (``load(profile=...)``'s
    argument: a ConfigError, as every bad load() argument)."""


class SliceError(BundleError):
    """A slice's ``.tflite`` bytes are not a graph edge-sdk can run safely: malformed, outside
    what the writer writes, unsound (shapes, types, indices, constants), or refused by the
    interpreter at allocation. Raised before any invoke."""


class SignatureError(BundleError):
    """Base of the signed-bundle refusals (``load(..., trusted_keys=...)``, docs/signing.md)."""


class UnsignedBundleError(SignatureError):
    """Trusted keys were given but the bundle has no signature file."""


class UntrustedKeyError(SignatureError):
    """The bundle is signed, by a key that is not among the trusted keys."""


class SignatureMismatchError(SignatureError):
    """The signature names a trusted key but does not verify: the manifest's bytes changed
    after signing (or the signature file was edited)."""


class UnlistedFileError(SignatureError):
    """A signed bundle holds a file its manifest does not list (nothing unsigned may ride
    along in a bundle an app trusts)."""


class ChecksumMismatchError(BundleError):
    """A listed file's size or sha256 is not the manifest's: a byte changed after export (or,
    for a signed bundle, after signing)."""


class SigningKeyError(ConfigError):
    """A signing or trusted key is missing, unreadable, or not an Ed25519 PEM key of the
    expected kind (private: PKCS#8; public: SubjectPublicKeyInfo). ``load(trusted_keys=...)``'s
    argument: a ConfigError, as every bad load() argument."""


class SigningUnavailableError(EdgeSdkError):
    """Signing or verifying needs the optional ``cryptography`` package, which is absent."""


class AllocationError(SliceError):
    """The interpreter refused to allocate (or resize) a slice's tensors."""


class OutputError(BundleError):
    """A configuration answered non-finite logits or probabilities (a slice or a manifest
    number that checks could not rule out): refused rather than answering NaN."""
