"""The enum values of TFLite's ``schema.fbs`` that the writer writes and the reader reads back:
builtin operator codes, the options table each op carries, tensor types and the model version
(tests/edge_sdk/test_tflite_writer.py checks them against ai-edge-litert's generated module).
"""
from __future__ import annotations

__all__ = ["BUILTIN_CODES", "MODEL_VERSION", "OPTIONS_TYPES", "TENSOR_TYPES"]

# schema.fbs enum BuiltinOperator
BUILTIN_CODES = {"ADD": 0, "AVERAGE_POOL_2D": 1, "CONCATENATION": 2, "CONV_2D": 3,
                 "DEPTHWISE_CONV_2D": 4, "DEQUANTIZE": 6, "FULLY_CONNECTED": 9,
                 "MAX_POOL_2D": 17, "RELU": 19, "RELU6": 21, "RESHAPE": 22, "SOFTMAX": 25,
                 "PAD": 34, "MEAN": 40, "MUL": 18, "LOGISTIC": 14, "PADV2": 60,
                 "HARD_SWISH": 117, "SLICE": 65, "GATHER": 36,
                 "RESIZE_NEAREST_NEIGHBOR": 97, "RESIZE_BILINEAR": 23, "CAST": 53,
                 "QUANTIZE": 114, "L2_NORMALIZATION": 11, "REDUCE_MAX": 82, "LOG": 73,
                 "REDUCE_MIN": 89}
# schema.fbs union BuiltinOptions: the options table each op carries (0 = none)
OPTIONS_TYPES = {"Conv2DOptions": 1, "DepthwiseConv2DOptions": 2, "Pool2DOptions": 5,
                 "FullyConnectedOptions": 8, "SoftmaxOptions": 9, "ConcatenationOptions": 10,
                 "AddOptions": 11, "ReshapeOptions": 17, "PadOptions": 22, "ReducerOptions": 27,
                 "DequantizeOptions": 38, "MulOptions": 21, "PadV2Options": 43,
                 "GatherOptions": 23, "ResizeBilinearOptions": 15,
                 "ResizeNearestNeighborOptions": 74, "QuantizeOptions": 89, "L2NormOptions": 12}
TENSOR_TYPES = {"float32": 0, "int32": 2, "uint8": 3, "int8": 9}  # enum TensorType
# the schema version every runtime expects
MODEL_VERSION = 3
