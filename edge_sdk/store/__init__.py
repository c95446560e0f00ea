"""The weight store (docs/store.md): one copy of the network for every width and
posterior sample. Torch-free: numpy only.

- :mod:`.packing`: bit-packed codebook indices and non-zero masks;
- :mod:`.sampler`: the pinned counter-based sampler ``hash32-v1`` (normals, categoricals);
- :mod:`.container`: the ``store.bin`` file format (a JSON index plus named arrays; version 2
  deflate-compressed);
- the per-channel int8 grid it shares with the exporter is :mod:`edge_sdk.tflite.quant`;
- :mod:`.materialize`: (store, width, sample) -> ``.tflite`` bytes (docs/store.md §3).

Imports: edge_sdk.errors, edge_sdk.validation, edge_sdk.tflite, edge_sdk.bundle, edge_sdk.trust.
"""
from edge_sdk.store.container import (ALIGN, COMPRESSED_VERSION, DTYPES, FORMAT_VERSION, MAGIC,
                                      MAX_INNER_BYTES, READABLE_VERSIONS, Store, compress_store,
                                      decode_store, encode_store)
from edge_sdk.store.packing import (bits_for, pack_bits, pack_mask, packed_size, unpack_bits,
                                    unpack_mask)
from edge_sdk.store.sampler import (NORMAL_BOUND, NORMAL_SCALE, SAMPLER, categorical, hash32,
                                    normal, stream_id, uniform_u16, uniform_u32)

from edge_sdk.store.materialize import materialize, materialize_file, materialize_graph  # noqa: E402

__all__ = [
    "materialize", "materialize_file", "materialize_graph",
    "ALIGN", "COMPRESSED_VERSION", "DTYPES", "FORMAT_VERSION", "MAGIC", "MAX_INNER_BYTES",
    "READABLE_VERSIONS", "Store", "compress_store", "decode_store", "encode_store",
    "bits_for", "pack_bits", "pack_mask", "packed_size", "unpack_bits", "unpack_mask",
    "NORMAL_BOUND", "NORMAL_SCALE", "SAMPLER", "categorical", "hash32", "normal", "stream_id",
    "uniform_u16", "uniform_u32",
]
