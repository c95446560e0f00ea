"""The model a user holds: :func:`~.loading.load` reads, verifies and checks a bundle into
an :class:`~.model.EdgeModel`; its calls run plans on this thread's interpreters
(:mod:`.execute`, :mod:`.execute_batch`, :mod:`.residency`), with what ``load`` works out once
(:mod:`.startup`), a trace recorder (:mod:`.recorder`) and the policy's decision table
(:mod:`.explain`).

Imports: every other package of edge_sdk but edge_sdk.cli.
"""
