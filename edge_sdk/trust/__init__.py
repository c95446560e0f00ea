"""What decides whether a bundle's bytes may be believed: Ed25519 signatures over the
manifest (:mod:`.signing`), and the manifest's JSON Schema (:mod:`.schema`, generated from the
bundle's dataclasses) with the small validator that exercises it (:mod:`.schema_check`).

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.bundle.
"""
