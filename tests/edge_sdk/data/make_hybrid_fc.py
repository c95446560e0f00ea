"""Writes the hybrid FULLY_CONNECTED fixtures of tests/edge_sdk/test_backends.py (run from the
repository root with the workstation install: ``.venv/bin/python tests/edge_sdk/data/make_hybrid_fc.py``).

One FULLY_CONNECTED layer, x [3, 16] float32 -> [3, 8], with int8 per-channel weights (channel
scales spread over 50x, so a kernel that ignores them is visibly wrong), as the exporter's hybrid
route writes it:

  hybrid_fc_v12.tflite  op version 12, the exporter's (correct) marking
  hybrid_fc_v3.tflite   the same model marked version 3, as older writers did
  hybrid_fc.npz         x, and reference = x @ dequantized(w).T + b
"""
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from exporters.tflite import ChannelQuant, GraphBuilder, _AlignedBuilder, quantize_per_channel

HERE = Path(__file__).resolve().parent


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = (rng.standard_normal((8, 16)) * np.linspace(0.1, 5, 8)[:, None]).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    q = quantize_per_channel(w, 0)
    g = GraphBuilder()
    inp = g.add_input("input", x.shape)
    wt = g.add_const(q.values, "w", ChannelQuant(q.scale, 0))
    g.mark_output(g.fully_connected(inp, wt, g.add_const(b, "b"), name="fc"), "logits")
    v12 = g.finish()
    m = schema.ModelT.InitFromPackedBuf(v12, 0)
    assert [oc.version for oc in m.operatorCodes] == [12]
    m.operatorCodes[0].version = 3
    builder = _AlignedBuilder(len(v12) + 4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    (HERE / "hybrid_fc_v12.tflite").write_bytes(v12)
    (HERE / "hybrid_fc_v3.tflite").write_bytes(bytes(builder.Output()))
    np.savez(HERE / "hybrid_fc.npz", x=x, reference=x @ q.dequantize().T + b)


if __name__ == "__main__":
    main()
