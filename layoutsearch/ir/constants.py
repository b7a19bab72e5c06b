"""Constant tensors: input tensors whose values the graph carries.

An imported model computes some arrays from constants alone (a causal mask, a rotary table, position
ids): the importer folds them into ``input`` tensors of the graph (no gradient, counted in memory, placed
by the layout like any input) and keeps their values in ``graph.meta["constants"]``, so a graph file holds
them as data: ``{"dtype": "float32", "shape": [16, 16], "zlib_base64": "..."}`` per tensor, the
C-ordered bytes compressed with zlib and written in base64 (never pickled). The backend feeds these values
where it would feed data.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from layoutsearch.errors import GraphFormatError
from layoutsearch.ir.tensor import DTYPE_BYTES, Tensor

MAX_CONSTANT_BYTES = 1 << 30
"""The most bytes one constant's values may take, decoded (1 GiB)."""


def encode(value: np.ndarray) -> dict[str, Any]:
    """``value`` as JSON-ready data (see the module)."""
    data = np.array(value, order="C")  # (not ascontiguousarray: a 0-d array stays 0-d)
    return {"dtype": data.dtype.name, "shape": list(data.shape),
            "zlib_base64": base64.b64encode(zlib.compress(data.tobytes(), 6)).decode("ascii")}


def decode(doc: Any, tensor: Tensor) -> np.ndarray:
    """The values of constant ``tensor`` from ``doc`` (as :func:`encode` writes them); GraphFormatError
    unless ``doc`` is well formed and fits the tensor's shape and dtype."""
    where = f"constant {tensor.name!r}"
    if not isinstance(doc, Mapping) or set(doc) != {"dtype", "shape", "zlib_base64"}:
        raise GraphFormatError(f"{where}: expected {{\"dtype\", \"shape\", \"zlib_base64\"}}")
    shape = [d.size for d in tensor.dims]
    if doc["dtype"] != tensor.dtype or doc["shape"] != shape:
        raise GraphFormatError(f"{where}: values of {doc['dtype']} {doc['shape']} for a tensor of "
                               f"{tensor.dtype} {shape}")
    if tensor.role != "input":
        raise GraphFormatError(f"{where}: only input tensors carry values (this one is a {tensor.role})")
    size = tensor.num_elements * DTYPE_BYTES[tensor.dtype]
    if size > MAX_CONSTANT_BYTES:
        raise GraphFormatError(f"{where}: {size:,} bytes, more than the {MAX_CONSTANT_BYTES:,} a constant may take")
    text = doc["zlib_base64"]
    try:
        raw = zlib.decompressobj().decompress(base64.b64decode(text, validate=True) if isinstance(text, str)
                                              else b"", size + 1)
    except (binascii.Error, zlib.error, ValueError) as e:
        raise GraphFormatError(f"{where}: zlib_base64 is not base64 of zlib data ({e})") from None
    if len(raw) != size:
        raise GraphFormatError(f"{where}: {len(raw):,} bytes of values for a tensor of {size:,}")
    return np.frombuffer(raw, dtype=numpy_dtype(tensor.dtype)).reshape(shape)


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of an IR dtype (bfloat16 from ml_dtypes, which JAX installs)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def constant_values(tensors: Mapping[str, Tensor], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The values of every constant tensor a graph's ``meta`` carries (``tensors``: the graph's)."""
    docs = meta.get("constants", {})
    if not isinstance(docs, Mapping):
        raise GraphFormatError("meta.constants must map tensor names to values")
    out = {}
    for name, doc in docs.items():
        if name not in tensors:
            raise GraphFormatError(f"meta.constants names {name!r}, which is no tensor of the graph")
        out[name] = decode(doc, tensors[name])
    return out


__all__ = ["MAX_CONSTANT_BYTES", "constant_values", "decode", "encode", "numpy_dtype"]
