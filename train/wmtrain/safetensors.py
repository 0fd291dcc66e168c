"""A small safetensors writer and reader (the `safetensors` package is not required).

Layout: u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
padded with spaces to a multiple of 8, then the raw little-endian data; offsets
are relative to the start of the data.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

# safetensors dtype name -> numpy dtype of the stored bytes (BF16 as raw uint16)
_STORE = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(a)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _to_bytes(arr, dtype: str) -> tuple[bytes, list]:
    a = np.asarray(arr)
    shape = list(a.shape)
    if dtype == "BF16":
        data = f32_to_bf16_bits(a.astype(np.float32))
    else:
        if dtype not in _STORE:
            raise SafetensorsError(f"unsupported dtype {dtype}")
        data = a.astype(_STORE[dtype])
    return np.ascontiguousarray(data).tobytes(), shape


def _dtype_of(a: np.ndarray) -> str:
    for name, dt in (("F64", np.float64), ("F32", np.float32), ("F16", np.float16), ("I64", np.int64),
                     ("I32", np.int32), ("I16", np.int16), ("I8", np.int8), ("U8", np.uint8), ("BOOL", np.bool_)):
        if a.dtype == dt:
            return name
    raise SafetensorsError(f"no safetensors dtype for numpy {a.dtype}")


def save_file(tensors: dict, path: str, dtype: str | None = None, metadata: dict | None = None) -> None:
    """writes `tensors` (name -> numpy array or torch tensor) in insertion order.

    dtype: store every tensor as this safetensors dtype (F32, F16, BF16, ...);
    None keeps each array's own dtype. The file is written to a temporary
    name and renamed, so a reader never sees half a file.
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is not a tensor name")
        if hasattr(t, "detach"):  # torch tensor; numpy has no bfloat16
            t = t.detach().cpu()
            t = (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
        a = np.asarray(t)
        dt = dtype or _dtype_of(a)
        data, shape = _to_bytes(a, dt)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_header(path: str) -> tuple[dict, int]:
    """(header dict, byte offset of the data) with the layout checked."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short for a header")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} is out of range")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not an object")
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dt not in _STORE:
            raise SafetensorsError(f"{path}: {name}: unknown dtype {dt}")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise SafetensorsError(f"{path}: {name}: bad shape {shape}")
        if not (isinstance(offs, list) and len(offs) == 2 and 0 <= offs[0] <= offs[1] <= data_len):
            raise SafetensorsError(f"{path}: {name}: bad data_offsets {offs}")
        if offs[1] - offs[0] != int(np.prod(shape, dtype=np.int64)) * _STORE[dt].itemsize:
            raise SafetensorsError(f"{path}: {name}: {offs[1] - offs[0]} bytes do not match {dt}{shape}")
        spans.append((offs[0], offs[1], name))
    spans.sort()
    end = 0
    for b, e, name in spans:
        if b != end:
            raise SafetensorsError(f"{path}: {name}: data is not contiguous (gap or overlap at {b})")
        end = e
    if end != data_len:
        raise SafetensorsError(f"{path}: {data_len - end} trailing bytes after the last tensor")
    return header, 8 + n


def load_file(path: str, as_float32: bool = False) -> dict:
    """name -> numpy array in file order; BF16 comes back as float32.

    as_float32 converts every float tensor to float32."""
    header, base = read_header(path)
    out = {}
    with open(path, "rb") as f:
        buf = f.read()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        a = np.frombuffer(buf, dtype=_STORE[info["dtype"]], count=(e - b) // _STORE[info["dtype"]].itemsize,
                          offset=base + b).reshape(info["shape"])
        if info["dtype"] == "BF16":
            a = bf16_bits_to_f32(a)
        elif as_float32 and a.dtype.kind == "f":
            a = a.astype(np.float32)
        out[name] = a.copy()
    return out


def load_metadata(path: str) -> dict:
    header, _ = read_header(path)
    return dict(header.get("__metadata__", {}))
