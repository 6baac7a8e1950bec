"""A whole decode step of a Llama-family decoder in one C++ call (`decode.cpp`), and its torch
reference.

`DecodeModel` describes the weights once (`LinearSpec` / `LayerSpec`: tensors that stay owned by
the model and the KV pool; this module only keeps references so their memory outlives the C
structs pointing at it). `DecodeStep(model)` lays that out as the C structs of `decode.cpp` and
then runs steps: `step(ids, pos, loc, rows, lens)` -> the final-normed hidden states `[B, hidden]`
fp32 (the LM head's input), having stored each request's new K/V at `loc[b]` in the pool. Inputs
are int64 tensors of B entries: token ids, positions, KV slots, `req_to_token` rows and sequence
lengths (the new token included). `decode_step_ref` computes the same with torch operators (and
stores the same K/V), layer by layer as `runtime/models/llama.py` does.

A linear layer's parts are stacked along its output rows: a dense weight (fp32/fp16/bf16
`[n, K]`, qtype -1) or GGUF block rows (uint8 `[n, row_bytes]`, qtype the ggml type id).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from radixlm.kernels.cpu import linear as cl
from radixlm.kernels.cpu.attention import decode_attention_ref

MAX_PARTS = 4


class LinearSpec(NamedTuple):
    parts: list[tuple[torch.Tensor, int]]  # (weight, qtype; -1: dense) stacked along rows
    k: int  # input features
    bias: torch.Tensor | None = None  # [N] fp32


class LayerSpec(NamedTuple):
    qkv: LinearSpec  # rows: q [H * Dh], k [KVH * Dh], v [KVH * Dh]
    o: LinearSpec
    gate_up: LinearSpec  # rows: gate [I], up [I]
    down: LinearSpec
    in_norm: torch.Tensor  # [hidden] fp32
    post_norm: torch.Tensor
    k_pool: torch.Tensor  # [slots, KVH, Dh] fp32 / fp16 / bf16
    v_pool: torch.Tensor


class DecodeModel(NamedTuple):
    layers: list[LayerSpec]
    emb: torch.Tensor  # [vocab, hidden] fp32 / fp16 / bf16
    final_norm: torch.Tensor  # [hidden] fp32
    cos: torch.Tensor  # [max_pos, Dh / 2] fp32
    sin: torch.Tensor
    table: torch.Tensor  # req_to_token [rows, context] int32
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float
    scale: float


class _Linear(ctypes.Structure):
    _fields_ = [
        ("K", ctypes.c_int64),
        ("N", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("nparts", ctypes.c_int32),
        ("kind", ctypes.c_int32 * MAX_PARTS),
        ("type", ctypes.c_int32 * MAX_PARTS),
        ("rows", ctypes.c_int64 * MAX_PARTS),
        ("w", ctypes.c_void_p * MAX_PARTS),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", _Linear),
        ("o", _Linear),
        ("gate_up", _Linear),
        ("down", _Linear),
        ("in_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("k_pool", ctypes.c_void_p),
        ("v_pool", ctypes.c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *[(n, ctypes.c_int64) for n in ("n_layers", "hidden", "heads", "kv_heads")],
        *[(n, ctypes.c_int64) for n in ("head_dim", "inter")],
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("kv_type", ctypes.c_int32),
        ("emb_type", ctypes.c_int32),
        *[(n, ctypes.c_void_p) for n in ("emb", "final_norm", "cos", "sin", "table")],
        ("table_stride", ctypes.c_int64),
        ("layers", ctypes.c_void_p),
    ]


def _check_linear(spec: LinearSpec) -> bool:
    base = 0
    for w, qtype in spec.parts:
        if not w.is_contiguous():
            return False
        if qtype >= cl.QPACK and base % cl.PACK_ROWS:
            return False  # NOTE: the step's row chunks must meet a packed part on its groups
        base += w.shape[0]
        if qtype < 0 and w.dtype not in cl._WTYPES:
            return False
        if qtype >= 0 and (qtype not in cl.BLOCK_BYTES or spec.k % cl.BLOCK_ELEMS[qtype]):
            return False
    if spec.k > cl.MAX_K:
        return False
    return 0 < len(spec.parts) <= MAX_PARTS


def supported(model: DecodeModel) -> bool:
    """Whether `DecodeStep` runs this model on this machine (library, shapes, dtypes)."""
    lib = cl._lib()
    if lib is None:
        return False
    width = lib.rl_simd_width()
    hidden = model.emb.shape[1]
    ok = hidden % width == 0 and model.head_dim % width == 0 and model.head_dim <= 16 * width
    ok = ok and model.heads % model.kv_heads == 0 and model.emb.dtype in cl._WTYPES
    ok = ok and model.table.dtype == torch.int32 and model.table.is_contiguous()
    for layer in model.layers:
        ok = ok and all(_check_linear(s) for s in (layer.qkv, layer.o, layer.gate_up, layer.down))
        ok = ok and layer.k_pool.dtype in cl._WTYPES and layer.k_pool.dtype == layer.v_pool.dtype
    return ok


def _linear(spec: LinearSpec) -> _Linear:
    out = _Linear()
    out.K = spec.k
    out.N = sum(w.shape[0] for w, _ in spec.parts)
    out.bias = None if spec.bias is None else spec.bias.data_ptr()
    out.nparts = len(spec.parts)
    for i, (w, qtype) in enumerate(spec.parts):
        out.kind[i] = 0 if qtype < 0 else 1
        out.type[i] = cl._WTYPES[w.dtype] if qtype < 0 else qtype
        out.rows[i] = w.shape[0]
        out.w[i] = w.data_ptr()
    return out


class DecodeStep:
    """The C structs of one `DecodeModel` (built once) and the call that runs a step on them."""

    def __init__(self, model: DecodeModel) -> None:
        assert supported(model)
        self.model = model  # NOTE: keeps every tensor the structs point at alive
        self.hidden = model.emb.shape[1]
        self._layers = (_Layer * len(model.layers))()
        for i, spec in enumerate(model.layers):
            layer = self._layers[i]
            layer.qkv, layer.o = _linear(spec.qkv), _linear(spec.o)
            layer.gate_up, layer.down = _linear(spec.gate_up), _linear(spec.down)
            layer.in_norm, layer.post_norm = spec.in_norm.data_ptr(), spec.post_norm.data_ptr()
            layer.k_pool, layer.v_pool = spec.k_pool.data_ptr(), spec.v_pool.data_ptr()
        m = self._model = _Model()
        m.n_layers, m.hidden, m.heads = len(model.layers), self.hidden, model.heads
        m.kv_heads, m.head_dim, m.inter = model.kv_heads, model.head_dim, model.inter
        m.eps, m.scale = model.eps, model.scale
        m.kv_type = cl._WTYPES[model.layers[0].k_pool.dtype] if model.layers else 0
        m.emb_type, m.emb = cl._WTYPES[model.emb.dtype], model.emb.data_ptr()
        m.final_norm, m.cos, m.sin = (
            t.data_ptr() for t in (model.final_norm, model.cos, model.sin)
        )
        m.table, m.table_stride = model.table.data_ptr(), model.table.stride(0)
        m.layers = ctypes.addressof(self._layers)
        self._scratch: dict[int, torch.Tensor] = {}

    def step(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        loc: torch.Tensor,
        rows: torch.Tensor,
        lens: torch.Tensor,
        table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states [B, D] of rows `ids`; row b attends over the slots
        `table[rows[b], :lens[b]]` (`table`: the model's `req_to_token` when None; another int32
        table, e.g. a verify step's per-node slot rows, for this call only)."""
        lib = cl._lib()
        assert lib is not None
        b = ids.shape[0]
        buf = self._scratch.get(b)
        if buf is None:  # NOTE: one scratch buffer per batch size, reused by every step
            buf = torch.empty(lib.rl_decode_scratch(ctypes.byref(self._model), b))
            self._scratch[b] = buf
        args = [t if t.dtype == torch.int64 else t.long() for t in (ids, pos, loc, rows, lens)]
        args = [t if t.is_contiguous() else t.contiguous() for t in args]
        out = torch.empty(b, self.hidden)
        m = self._model
        if table is not None:
            assert table.dtype == torch.int32 and table.stride(1) == 1
            m.table, m.table_stride = table.data_ptr(), table.stride(0)
        try:
            rc = lib.rl_decode_step(
                ctypes.byref(m), *(t.data_ptr() for t in args), b, out.data_ptr(),
                buf.data_ptr(),
            )  # fmt: skip
        finally:
            if table is not None:  # NOTE: back to `req_to_token` (the decode steps' table)
                m.table, m.table_stride = self.model.table.data_ptr(), self.model.table.stride(0)
        assert rc == 0, rc  # NOTE: `supported` checked the shapes at construction
        return out


# ---- torch reference ------------------------------------------------------------------------------
def _linear_ref(spec: LinearSpec, x: torch.Tensor) -> torch.Tensor:
    ys = [
        x @ w.float().t() if q < 0 else cl.linear_quant_ref(x, w, q, spec.k) for w, q in spec.parts
    ]
    y = torch.cat(ys, dim=-1)
    return y if spec.bias is None else y + spec.bias


def _norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def decode_step_ref(
    model: DecodeModel,
    ids: torch.Tensor,
    pos: torch.Tensor,
    loc: torch.Tensor,
    rows: torch.Tensor,
    lens: torch.Tensor,
) -> torch.Tensor:
    """`DecodeStep.step`'s math in torch ops (fp32), storing the same K/V into the pool."""
    b, h, kvh, dh = ids.shape[0], model.heads, model.kv_heads, model.head_dim
    res = model.emb[ids].float()
    cos, sin = model.cos[pos].unsqueeze(1), model.sin[pos].unsqueeze(1)
    out = None
    for layer in model.layers:
        if out is not None:
            res = res + out
        qkv = _linear_ref(layer.qkv, _norm_ref(res, layer.in_norm, model.eps))
        q, k, v = qkv.split([h * dh, kvh * dh, kvh * dh], dim=-1)
        q = _rotate_ref(q.reshape(b, h, dh), cos, sin)
        k = _rotate_ref(k.reshape(b, kvh, dh), cos, sin)
        layer.k_pool[loc] = k.to(layer.k_pool.dtype)
        layer.v_pool[loc] = v.reshape(b, kvh, dh).to(layer.v_pool.dtype)
        o = decode_attention_ref(
            q, layer.k_pool, layer.v_pool, model.table, rows, lens, model.scale
        )
        res = res + _linear_ref(layer.o, o.reshape(b, h * dh))
        gu = _linear_ref(layer.gate_up, _norm_ref(res, layer.post_norm, model.eps))
        gate, up = gu.split([model.inter, model.inter], dim=-1)
        out = _linear_ref(layer.down, torch.nn.functional.silu(gate) * up)
    if out is not None:
        res = res + out
    return _norm_ref(res, model.final_norm, model.eps)
