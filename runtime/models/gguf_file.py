"""A small, fast reader for GGUF files: metadata, tensor directory and de-quantization.

`gguf.GGUFReader` builds a numpy view for every metadata item and takes ~5 s on the default
model's 49k-token vocabulary; this reader parses the header with `struct` in ~0.1 s and memory-maps
the tensor data. De-quantization covers the formats the default model uses (F32, F16, BF16, Q8_0,
Q4_0, Q4_1) with vectorised torch ops; any other type falls back to `gguf.quants.dequantize`.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian, version 2/3).
"""

from __future__ import annotations

import struct
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

import numpy as np

_MAGIC = b"GGUF"

# Metadata value types.
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(8, 13)
_SCALARS = {
    _UINT8: "<B",
    _INT8: "<b",
    _UINT16: "<H",
    _INT16: "<h",
    _UINT32: "<I",
    _INT32: "<i",
    _FLOAT32: "<f",
    _BOOL: "<?",
    _UINT64: "<Q",
    _INT64: "<q",
    _FLOAT64: "<d",
}
_NUMPY = {
    _UINT8: np.uint8,
    _INT8: np.int8,
    _UINT16: np.uint16,
    _INT16: np.int16,
    _UINT32: np.uint32,
    _INT32: np.int32,
    _FLOAT32: np.float32,
    _BOOL: np.bool_,
    _UINT64: np.uint64,
    _INT64: np.int64,
    _FLOAT64: np.float64,
}

# ggml tensor types handled natively: type id -> (name, block size, bytes per block).
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
_BLOCKS = {
    GGML_F32: ("F32", 1, 4),
    GGML_F16: ("F16", 1, 2),
    GGML_BF16: ("BF16", 1, 2),
    GGML_Q4_0: ("Q4_0", 32, 18),
    GGML_Q4_1: ("Q4_1", 32, 20),
    GGML_Q8_0: ("Q8_0", 32, 34),
}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # torch order (outermost first): the reverse of ggml's ne[]
    ggml_type: int
    data: np.ndarray  # raw bytes (uint8 view into the memory map)

    def to_torch(self) -> torch.Tensor:
        """De-quantize to float32 (F16/BF16 keep their own dtype). F32 tensors alias the file."""
        return dequantize(self.data, self.ggml_type, self.shape)


class GGUFFile:
    """Parsed GGUF file: `metadata` (key -> python value) and `tensors` (name -> GGUFTensor)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self._mm)
        if bytes(buf[:4]) != _MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {version}")
        off = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, off = _read_str(buf, off)
            (vtype,) = struct.unpack_from("<I", buf, off)
            value, off = _read_value(buf, off + 4, vtype)
            self.metadata[key] = value
        infos = []
        for _ in range(n_tensors):
            name, off = _read_str(buf, off)
            (n_dims,) = struct.unpack_from("<I", buf, off)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            ggml_type, data_off = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            infos.append((name, tuple(reversed(dims)), ggml_type, data_off))
        align = int(self.metadata.get("general.alignment", 32))
        base = (off + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, ggml_type, data_off in infos:
            nbytes = _nbytes(ggml_type, shape)
            start = base + data_off
            self.tensors[name] = GGUFTensor(
                name, shape, ggml_type, self._mm[start : start + nbytes]
            )

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def _read_str(buf: memoryview, off: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, off)
    off += 8
    return bytes(buf[off : off + n]).decode("utf-8", errors="replace"), off + n


def _read_value(buf: memoryview, off: int, vtype: int) -> tuple[Any, int]:
    if vtype == _STRING:
        return _read_str(buf, off)
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, off)[0], off + struct.calcsize(fmt)
    if vtype == _ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if etype in _NUMPY:
            arr = np.frombuffer(buf, dtype=_NUMPY[etype], count=n, offset=off)
            return arr.tolist(), off + arr.nbytes
        out = []
        for _ in range(n):
            item, off = _read_value(buf, off, etype)
            out.append(item)
        return out, off
    raise GGUFError(f"unknown GGUF metadata type {vtype}")


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    n = int(np.prod(shape)) if shape else 1
    if ggml_type in _BLOCKS:
        _, block, size = _BLOCKS[ggml_type]
        return n // block * size
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return n // block * size


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """De-quantize raw GGUF tensor bytes into a tensor of `shape` (float32; F16/BF16 keep their dtype)."""
    import torch  # NOTE: lazy, so that reading a GGUF's tokenizer does not import torch

    with warnings.catch_warnings():
        # NOTE: the memory map is read-only; torch warns about that but never writes through it.
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(np.asarray(raw))
    if ggml_type == GGML_F32:
        return data.view(torch.float32).view(shape)
    if ggml_type == GGML_F16:
        return data.view(torch.float16).view(shape)
    if ggml_type == GGML_BF16:
        return data.view(torch.bfloat16).view(shape)
    if ggml_type in (GGML_Q4_0, GGML_Q4_1, GGML_Q8_0):
        _, _, size = _BLOCKS[ggml_type]
        blocks = data.view(-1, size)
        d = blocks[:, :2].contiguous().view(torch.float16).float()
        if ggml_type == GGML_Q8_0:
            q = blocks[:, 2:].contiguous().view(torch.int8).float()
            return (q * d).view(shape)
        qs = blocks[:, 4:] if ggml_type == GGML_Q4_1 else blocks[:, 2:]
        # NOTE: the low nibbles hold elements 0..15 of the block, the high nibbles 16..31.
        q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
        if ggml_type == GGML_Q4_1:
            m = blocks[:, 2:4].contiguous().view(torch.float16).float()
            return (q * d + m).view(shape)
        return ((q - 8.0) * d).view(shape)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType(ggml_type)).reshape(shape))


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row interleave (any trailing shape: values or GGUF block rows)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
