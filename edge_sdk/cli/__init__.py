"""The ``edge-sdk`` console script: the dispatcher (:mod:`.main`, subcommands found through
the ``edge_sdk.commands`` entry-point group and loaded on use), the device-side subcommands
(:mod:`.device`: ``run``, ``bench``, ``profile``, ``materialize``) and the signing ones
(:mod:`.signing`: ``keygen``, ``sign``).

Imports: anything of edge_sdk (the top layer).
"""
