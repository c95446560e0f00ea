"""Signed bundles (issue 36, docs/signing.md): ``edge-sdk keygen`` / ``sign``, ``load(...,
trusted_keys=...)`` and ``--trusted-key``, each refusal with its own type, OpenSSL's key files
and signature check interoperating, and the install line when ``cryptography`` is absent.
Real keys, real signatures, the real runtime on the session's bundle; no torch."""
from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.cli import main as cli
from edge_sdk.bundle import MANIFEST_NAME, read_manifest
from edge_sdk.errors import (
    BundleError,
    ChecksumMismatchError,
    SignatureError,
    SignatureMismatchError,
    SigningKeyError,
    SigningUnavailableError,
    UnlistedFileError,
    UnsignedBundleError,
    UntrustedKeyError,
)
from edge_sdk.bundle.records import SIGNATURE_NAME
from test_store_runtime import fake  # noqa: F401 - the store bundle fixture

HAVE_CRYPTO = True
try:
    import cryptography  # noqa: F401
except ImportError:
    HAVE_CRYPTO = False
needs_crypto = pytest.mark.skipif(not HAVE_CRYPTO, reason="cryptography is not installed "
                                  "(the [sign] extra); its absence is tested below")
OPENSSL = shutil.which("openssl")


def _copy(bundle: Path, dst: Path) -> Path:
    shutil.copytree(bundle, dst, ignore=shutil.ignore_patterns(SIGNATURE_NAME))
    return dst


def _x(bundle: Path) -> np.ndarray:
    spec = read_manifest(bundle).input
    lo, hi = spec.value_range
    return np.random.default_rng(3).uniform(lo, hi, spec.shape[1:]).astype(np.float32)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    if not HAVE_CRYPTO:
        pytest.skip("cryptography is not installed")
    from edge_sdk.trust.signing import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    ours = generate_keypair(d / "team.pem")
    theirs = generate_keypair(d / "other.pem", d / "other.pub")
    return {"private": ours[0], "public": ours[1], "other_private": theirs[0],
            "other_public": theirs[1]}


@pytest.fixture
def signed(bundle, tmp_path, keys) -> Path:
    from edge_sdk.trust.signing import sign_bundle

    b = _copy(bundle, tmp_path / "b")
    sign_bundle(b, keys["private"])
    return b


# ------------------------------------------------------------------------ keys and files
@needs_crypto
def test_keygen_writes_pkcs8_and_spki_pem_the_private_key_private(keys):
    priv, pub = keys["private"].read_bytes(), keys["public"].read_bytes()
    assert priv.startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8, unencrypted
    assert pub.startswith(b"-----BEGIN PUBLIC KEY-----\n")  # SubjectPublicKeyInfo
    assert keys["private"].stat().st_mode & 0o077 == 0
    assert keys["public"].name == "team.pem.pub"


@needs_crypto
def test_the_signature_file_is_four_strict_lines_over_the_manifest_bytes(signed, keys):
    from edge_sdk.trust.signing import key_id, load_public_key

    lines = (signed / SIGNATURE_NAME).read_text("ascii").splitlines()
    assert lines[:2] == ["edge-sdk-signature: 1", "algorithm: ed25519"]
    assert lines[2] == f"key: {key_id(load_public_key(keys['public']))}"
    sig = base64.b64decode(lines[3].removeprefix("signature: "))
    load_public_key(keys["public"]).verify(sig, (signed / MANIFEST_NAME).read_bytes())


# ----------------------------------------------------------------------------- round trips
@needs_crypto
def test_a_signed_bundle_loads_with_its_key_and_answers_as_unsigned(bundle, signed, keys):
    x = _x(bundle)
    plain = edge_sdk.load(bundle, profile=None)
    for trusted in ([keys["public"]], [str(keys["public"])], [keys["public"].read_bytes()],
                    [keys["other_public"], keys["public"]], keys["public"]):
        m = edge_sdk.load(signed, profile=None, trusted_keys=trusted)
        assert m.signed
        for c in m.manifest.configurations:
            assert np.array_equal(m.predict(x, config_id=c.id).probs,
                                  plain.predict(x, config_id=c.id).probs)


@needs_crypto
def test_re_signing_replaces_the_signature(signed, keys):
    from edge_sdk.trust.signing import sign_bundle

    sign_bundle(signed, keys["other_private"])
    edge_sdk.load(signed, profile=None, trusted_keys=[keys["other_public"]])
    with pytest.raises(UntrustedKeyError):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["public"]])


# --------------------------------------------------------------------------------- refusals
@needs_crypto
def test_an_unsigned_bundle_is_refused(bundle, tmp_path, keys):
    with pytest.raises(UnsignedBundleError, match=r"is not signed \(no manifest\.yaml\.sig\)"):
        edge_sdk.load(_copy(bundle, tmp_path / "b"), profile=None, trusted_keys=[keys["public"]])


@needs_crypto
def test_a_bundle_signed_by_another_key_is_refused(signed, keys):
    with pytest.raises(UntrustedKeyError, match=r"is signed by key [0-9a-f]{16}\.\.\., which is "
                                                r"not among the 1 trusted key\(s\)"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["other_public"]])


@needs_crypto
@pytest.mark.parametrize("edit", ["comment", "temperature", "garbage"])
def test_a_manifest_byte_changed_after_signing_is_refused_before_parsing(signed, keys, edit):
    """Even bytes that are not YAML at all are refused for their signature, not parsed: the
    parser never sees unsigned input."""
    p = signed / MANIFEST_NAME
    text = p.read_text()
    p.write_text({"comment": text + "# appended\n",
                  "temperature": text.replace("temperature: ", "temperature: 1", 1),
                  "garbage": text + "\x00[{: not yaml\n"}[edit])
    with pytest.raises(SignatureMismatchError, match="the manifest changed after it was signed"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["public"]])


@needs_crypto
def test_a_listed_file_byte_changed_after_signing_is_refused(signed, keys):
    name = read_manifest(signed).configurations[0].files[0].name
    data = bytearray((signed / name).read_bytes())
    data[len(data) // 2] ^= 1
    (signed / name).write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match=rf"checksum mismatch for '{name}'"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["public"]])


@needs_crypto
@pytest.mark.parametrize("extra", ["extra.tflite", ".hidden", "notes.txt"])
def test_a_file_the_manifest_does_not_list_is_refused(signed, keys, extra):
    (signed / extra).write_bytes(b"x")
    with pytest.raises(UnlistedFileError, match=rf"1 file\(s\) its manifest does not list "
                                                rf"\('{extra}'\)"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["public"]])
    edge_sdk.load(signed, profile=None)  # without trusted keys nothing changes


@needs_crypto
@pytest.mark.parametrize("content", [b"", b"edge-sdk-signature: 1\n", b"\xff" * 100,
                                     b"x" * 5000])
def test_a_malformed_signature_file_is_typed(signed, keys, content):
    (signed / SIGNATURE_NAME).write_bytes(content)
    with pytest.raises(SignatureError, match="is not an edge-sdk signature file"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["public"]])


@needs_crypto
def test_keys_of_the_wrong_kind_are_typed(signed, keys, tmp_path):
    from edge_sdk.trust.signing import sign_bundle

    with pytest.raises(SigningKeyError, match="is a private key; trusted keys are public"):
        edge_sdk.load(signed, profile=None, trusted_keys=[keys["private"]])
    with pytest.raises(SigningKeyError, match="is a public key; signing needs the private"):
        sign_bundle(signed, keys["public"])
    with pytest.raises(SigningKeyError, match="does not exist"):
        edge_sdk.load(signed, profile=None, trusted_keys=[tmp_path / "nope.pem"])
    with pytest.raises(SigningKeyError, match="is not a PEM public key"):
        edge_sdk.load(signed, profile=None, trusted_keys=[b"-----BEGIN PUBLIC KEY-----\nAA\n"])
    with pytest.raises(SigningKeyError, match="trusted_keys is empty"):
        edge_sdk.load(signed, profile=None, trusted_keys=[])
    with pytest.raises(SigningKeyError, match="must be a list"):
        edge_sdk.load(signed, profile=None, trusted_keys=42)


@needs_crypto
def test_signing_refuses_a_bundle_that_does_not_verify(bundle, tmp_path, keys):
    from edge_sdk.trust.signing import sign_bundle

    b = _copy(bundle, tmp_path / "b")
    name = read_manifest(b).configurations[0].files[0].name
    (b / name).write_bytes((b / name).read_bytes()[:-1])
    with pytest.raises(ChecksumMismatchError):
        sign_bundle(b, keys["private"])
    assert not (b / SIGNATURE_NAME).exists()


# -------------------------------------------------------------------------------- OpenSSL
@needs_crypto
@pytest.mark.skipif(OPENSSL is None, reason="no openssl binary")
def test_openssl_keys_sign_and_openssl_verifies_our_signature(bundle, tmp_path):
    from edge_sdk.trust.signing import sign_bundle

    run = lambda *a: subprocess.run([OPENSSL, *a], check=True, capture_output=True)  # noqa
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    run("genpkey", "-algorithm", "ed25519", "-out", str(key))
    run("pkey", "-in", str(key), "-pubout", "-out", str(pub))
    b = _copy(bundle, tmp_path / "b")
    sign_bundle(b, key)
    edge_sdk.load(b, profile=None, trusted_keys=[pub])
    line = (b / SIGNATURE_NAME).read_text().splitlines()[3]
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(line.removeprefix("signature: ")))
    out = run("pkeyutl", "-verify", "-pubin", "-inkey", str(pub), "-rawin", "-in",
              str(b / MANIFEST_NAME), "-sigfile", str(tmp_path / "sig.bin"))
    assert b"Signature Verified Successfully" in out.stdout


# ----------------------------------------------------------------------------------- CLI
@needs_crypto
def test_the_cli_keygen_sign_and_run_with_trusted_key(bundle, tmp_path, capsys):
    b = _copy(bundle, tmp_path / "b")
    np.save(tmp_path / "x.npy", _x(bundle))
    key = tmp_path / "k.pem"
    assert cli.main(["keygen", str(key)]) == 0
    assert cli.main(["sign", str(b), "--key", str(key)]) == 0
    assert "wrote" in capsys.readouterr().out
    run = ["run", str(b), "--input", str(tmp_path / "x.npy"), "--profile", "none"]
    assert cli.main(run + ["--trusted-key", str(key) + ".pub"]) == 0
    assert cli.main(["bench", str(b), "--repeats", "2", "--trusted-key", str(key) + ".pub"]) == 0
    capsys.readouterr()
    (b / MANIFEST_NAME).write_text((b / MANIFEST_NAME).read_text() + "# edited\n")
    assert cli.main(run + ["--trusted-key", str(key) + ".pub"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "changed after it was signed" in err
    assert cli.main(["keygen", str(key)]) == 2  # exists: refused, one line
    assert "pass --force" in capsys.readouterr().err


@needs_crypto
def test_materialize_of_a_signed_store_bundle_re_signs_or_refuses(fake, tmp_path, keys):
    from edge_sdk.cli.device import materialize_main
    from edge_sdk.trust.signing import sign_bundle

    path, _ = fake
    sign_bundle(path, keys["private"])
    out = tmp_path / "files"
    with pytest.raises(SignatureError, match="pass --key"):
        materialize_main([str(path), "--out", str(out)])
    assert not out.exists()
    assert materialize_main([str(path), "--out", str(out), "--key", str(keys["other_private"]),
                             "--trusted-key", str(keys["public"])]) == 0
    edge_sdk.load(out, profile=None, trusted_keys=[keys["other_public"]])
    with pytest.raises(UntrustedKeyError):  # the store's signer did not sign the new manifest
        edge_sdk.load(out, profile=None, trusted_keys=[keys["public"]])
    with pytest.raises(UntrustedKeyError):  # the source is checked against --trusted-key
        materialize_main([str(path), "--out", str(tmp_path / "f2"), "--key",
                          str(keys["private"]), "--trusted-key", str(keys["other_public"])])


# ----------------------------------------------------------------- without cryptography
@pytest.fixture
def no_crypto(monkeypatch):
    for name in list(sys.modules):
        if name == "cryptography" or name.startswith("cryptography."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import raises ImportError


def test_without_cryptography_trusted_keys_are_refused_with_the_install_line(bundle, no_crypto,
                                                                               tmp_path, capsys):
    with pytest.raises(SigningUnavailableError, match=r"pip install 'nested-edge-sdk\[sign\]'"):
        edge_sdk.load(bundle, profile=None, trusted_keys=[b"any"])
    assert cli.main(["sign", str(bundle), "--key", str(tmp_path / "k.pem")]) == 2
    assert cli.main(["keygen", str(tmp_path / "k.pem")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("nested-edge-sdk[sign]" in line for line in err)
    assert not (tmp_path / "k.pem").exists()
    edge_sdk.load(bundle, profile=None)  # unsigned loading needs nothing of it


def test_signature_errors_are_bundle_errors():
    for cls in (UnsignedBundleError, UntrustedKeyError, SignatureMismatchError,
                UnlistedFileError, ChecksumMismatchError):
        assert issubclass(cls, BundleError)
