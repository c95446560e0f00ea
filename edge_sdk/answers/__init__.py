"""What the runtime returns beside a label, and the maths behind it, defined once.

- :mod:`.prediction`: the answer types (:class:`~.prediction.Prediction`, ``BatchPrediction``);
- :mod:`.maths`: the calibrated answer of a configuration's logits (hot path);
- :mod:`.graph`: the runtime's own graph around a slice (normalisation in front, the tempered
  softmax behind), so the interpreter computes what it can;
- :mod:`.predictive`, :mod:`.metrics`, :mod:`.metric_inputs`: probabilities, entropies, mutual
  information and the quality metrics the trainer, exporters and benchmarks share;
- :mod:`.ood`, :mod:`.conformal`, :mod:`.uncertainty`: the out-of-distribution score, split
  conformal prediction sets, and the bundle file that carries their statistics.

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.tflite, edge_sdk.bundle, edge_sdk.store.
"""
