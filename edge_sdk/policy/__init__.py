"""Which configuration answers a call: the app's budgets (:mod:`.budget`), what each
configuration is believed to cost (:mod:`.estimates`: a prior from the device profile, then
measured), the rule that chooses among them and the plan it leads to (:mod:`.plan`,
:mod:`.policy`), the device rules that narrow it while the device calls for it (:mod:`.rules`), and
device profiles (:mod:`.profiles`, :mod:`.measure`).

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.tflite, edge_sdk.bundle, edge_sdk.store,
edge_sdk.backends, edge_sdk.device.
"""
