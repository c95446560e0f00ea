"""TFLite flatbuffers without TensorFlow: the graph description a slice is made of
(:mod:`.tensors`, :mod:`.ops`, :mod:`.graph`, :mod:`.build`), the writer that turns it into
``.tflite`` bytes (:mod:`.writer`), the bounds-checked reader that parses bytes back and refuses
anything it would not have written (:mod:`.flatbuffer`, :mod:`.reader`, :mod:`.operands`), and
the short read of a file's operators and input/output tensors (:mod:`.model_info`).

Imports: edge_sdk.errors.
"""
