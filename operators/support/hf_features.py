"""Hugging Face ``datasets`` features in a parquet file's schema metadata.

``datasets.load_dataset("parquet", data_files=...)`` takes a file's features from the ``huggingface``
key of its Arrow schema metadata when present, else infers them from the Arrow types. Image bytes
are stored as ``datasets``' Image storage (``IMAGE_STORAGE``: a struct of the bytes and a path) and
declared an ``Image`` feature there, so they load as images (``datasets`` only takes metadata
features whose storage matches the column). This writes that metadata without importing
``datasets`` (not a dependency of the pipelines).
"""

from __future__ import annotations

import json

import pyarrow as pa

# ``datasets``' storage of an Image feature: the encoded bytes and an optional path
IMAGE_STORAGE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])

_VALUE_DTYPES = {pa.string(): "string", pa.large_string(): "large_string", pa.int8(): "int8", pa.int16(): "int16",
                 pa.int32(): "int32", pa.int64(): "int64", pa.uint8(): "uint8", pa.uint16(): "uint16",
                 pa.uint32(): "uint32", pa.uint64(): "uint64", pa.float16(): "float16", pa.float32(): "float32",
                 pa.float64(): "float64", pa.bool_(): "bool", pa.binary(): "binary", pa.large_binary(): "large_binary"}


def feature(kind: pa.DataType) -> dict | None:
    """The ``datasets`` feature of an Arrow type (scalars and lists of scalars); None otherwise."""
    if kind in _VALUE_DTYPES:
        return {"dtype": _VALUE_DTYPES[kind], "_type": "Value"}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = feature(kind.value_type)
        return {"feature": inner, "_type": "List"} if inner else None
    return None


def with_features(schema: pa.Schema, images: tuple[str, ...] = ()) -> pa.Schema:
    """``schema`` with ``datasets`` features in its metadata: ``images`` columns as ``Image``, the
    rest by their Arrow types. Unchanged when a column has a type without a plain feature."""
    features = {}
    for field in schema:
        f = {"_type": "Image"} if field.name in images else feature(field.type)
        if f is None:
            return schema
        features[field.name] = f
    meta = dict(schema.metadata or {})
    meta[b"huggingface"] = json.dumps({"info": {"features": features}}).encode()
    return schema.with_metadata(meta)
