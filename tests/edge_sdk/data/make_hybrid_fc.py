"""Writes the hybrid FULLY_CONNECTED fixtures of tests/edge_sdk/test_backends.py (run from the
repository root with the workstation install: ``.venv/bin/python tests/edge_sdk/data/make_hybrid_fc.py``).

One FULLY_CONNECTED layer, x [3, 16] float32 -> [3, 8], with int8 per-channel weights (channel
scales spread over 50x, so a kernel that ignores them is visibly wrong), as the exporter's hybrid
route writes it:

  hybrid_fc_v12.tflite  op version 12, the exporter's (correct) marking
  hybrid_fc_v3.tflite   the same model marked version 3, as older writers did
  hybrid_fc.npz         x, and reference = x @ dequantized(w).T + b
  hybrid_fc_8x8_v12.tflite, hybrid_fc_8x8_v3.tflite
                        the same route with the digits bundle's tensors (input [1, 8, 8, 1],
                        RESHAPE to [1, 64], output [1, 10]), so it can stand in for one of its
                        point slices: load() checks every slice's shapes against the manifest
"""
from pathlib import Path
from unittest import mock

import numpy as np

from edge_sdk.tflite import writer as tflite_writer
from exporters.tflite import ChannelQuant, GraphBuilder, quantize_per_channel

HERE = Path(__file__).resolve().parent


def _hybrid_fc(rng, x_shape, units: int, flatten: bool) -> tuple[bytes, bytes, object]:
    """(version 12 model, the same marked version 3, the quantized weights, the bias)."""
    features = int(np.prod(x_shape[1:]))
    w = (rng.standard_normal((units, features))
         * np.linspace(0.1, 5, units)[:, None]).astype(np.float32)
    b = rng.standard_normal(units).astype(np.float32)
    q = quantize_per_channel(w, 0)
    g = GraphBuilder()
    inp = g.add_input("input", x_shape)
    if flatten:
        inp = g.reshape(inp, (x_shape[0], features), name="flatten")
    wt = g.add_const(q.values, "w", ChannelQuant(q.scale, 0))
    g.mark_output(g.fully_connected(inp, wt, g.add_const(b, "b"), name="fc"), "logits")
    v12 = g.finish()
    # the same graph with FULLY_CONNECTED marked version 3, as older writers did
    with mock.patch.object(tflite_writer, "_version",
                           lambda op, ins: 3 if op == "FULLY_CONNECTED" else 1):
        v3 = g.finish()
    return v12, v3, (q, b)


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    v12, v3, (q, b) = _hybrid_fc(rng, x.shape, 8, flatten=False)
    (HERE / "hybrid_fc_v12.tflite").write_bytes(v12)
    (HERE / "hybrid_fc_v3.tflite").write_bytes(v3)
    np.savez(HERE / "hybrid_fc.npz", x=x, reference=x @ q.dequantize().T + b)
    v12, v3, _ = _hybrid_fc(rng, (1, 8, 8, 1), 10, flatten=True)
    (HERE / "hybrid_fc_8x8_v12.tflite").write_bytes(v12)
    (HERE / "hybrid_fc_8x8_v3.tflite").write_bytes(v3)


if __name__ == "__main__":
    main()
