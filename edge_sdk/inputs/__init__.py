"""What a call may be given: the checks of an input against the manifest's input spec
(:mod:`.checks`), photos turned into the model's input by a recorded transform (:mod:`.images`,
Pillow; :mod:`.photos`, the checks that take them), files read into that input space
(:mod:`.files`: ``.npy`` and images), and the check of a sample's raw statistics against the
training split's (:mod:`.stats`).

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.bundle.
"""
