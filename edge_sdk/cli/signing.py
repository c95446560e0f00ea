"""``edge-sdk sign`` and ``edge-sdk keygen`` (docs/signing.md). Built into the
dispatcher (:data:`edge_sdk.cli.main.BUILTIN_COMMANDS`); they need the optional ``cryptography``
package and say how to install it when it is absent (exit 2, one line)."""
from __future__ import annotations

import argparse


def keygen_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk keygen",
        description="Write a new Ed25519 key pair for signing bundles: the private key as "
                    "PKCS#8 PEM (mode 0600; keep it off devices) and the public key as "
                    "SubjectPublicKeyInfo PEM (ship it with the app: load(..., "
                    "trusted_keys=[...])). The same files openssl genpkey -algorithm ed25519 "
                    "and openssl pkey -pubout write.")
    p.add_argument("private", help="where to write the private key (PEM)")
    p.add_argument("--public", help="where to write the public key (default: PRIVATE.pub)")
    p.add_argument("--force", action="store_true", help="replace existing key files")
    args = p.parse_args(argv)
    from edge_sdk.trust.signing import generate_keypair, key_id, load_public_key

    priv, pub = generate_keypair(args.private, args.public, force=args.force)
    print(f"wrote {priv} (private, keep secret) and {pub} (public, key "
          f"{key_id(load_public_key(pub))[:16]}...)")
    return 0


def sign_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk sign",
        description="Sign a bundle: an Ed25519 signature over manifest.yaml's bytes (which "
                    "list every file's sha256), written to manifest.yaml.sig beside it. The "
                    "bundle must verify first (every listed file's size and sha256) and hold "
                    "nothing its manifest does not list.")
    p.add_argument("bundle", help="the bundle directory")
    p.add_argument("--key", required=True, help="the private key (PKCS#8 PEM)")
    args = p.parse_args(argv)
    from edge_sdk.trust.signing import key_id, load_private_key, sign_bundle

    out = sign_bundle(args.bundle, args.key)
    print(f"wrote {out} (key {key_id(load_private_key(args.key).public_key())[:16]}...)")
    return 0
