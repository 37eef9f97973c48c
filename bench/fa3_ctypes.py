#!/usr/bin/env python3
"""ctypes binding of fa3's C ABI (include/fa3/fa3_c.h).

The structs below must mirror the header field for field: ctypes cannot read C headers, so `load()`
compares their sizes with the ones compiled into the library and refuses to run on a mismatch
(a silent mismatch would hand the kernels garbage strides).

torch is imported lazily inside the tensor helpers, so that this module -- and `selftest()` -- work
on a machine without torch or a GPU (CI).

    python3 bench/fa3_ctypes.py --selftest [--lib PATH]
"""
import argparse
import ctypes
import os
import sys
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIB = os.path.join(REPO_ROOT, "build", "release", "libfa3.so")

# fa3_dtype
FA3_DTYPE_FP16 = 0
FA3_DTYPE_BF16 = 1
FA3_DTYPE_E4M3 = 2
FA3_DTYPE_FP32 = 3

# fa3_status
FA3_OK = 0
FA3_ERROR_INVALID_ARGUMENT = 1
FA3_ERROR_NOT_SUPPORTED = 2
FA3_ERROR_CUDA = 3
FA3_ERROR_INTERNAL = 4
STATUS_NAMES = {
    FA3_OK: "FA3_OK",
    FA3_ERROR_INVALID_ARGUMENT: "FA3_ERROR_INVALID_ARGUMENT",
    FA3_ERROR_NOT_SUPPORTED: "FA3_ERROR_NOT_SUPPORTED",
    FA3_ERROR_CUDA: "FA3_ERROR_CUDA",
    FA3_ERROR_INTERNAL: "FA3_ERROR_INTERNAL",
}

# C enums (fa3_dtype, fa3_status) are int-sized on every ABI fa3 targets.
c_enum = c_int


class Tensor(ctypes.Structure):
    """fa3_tensor: a strided [batch, seqlen, heads, d] view; strides in elements."""
    _fields_ = [
        ("data", c_void_p),
        ("batch_stride", c_int64),
        ("row_stride", c_int64),
        ("head_stride", c_int64),
    ]


class BlockScales(ctypes.Structure):
    """fa3_block_scales: float32 factors per block of block_size positions, [batch, heads, blocks]."""
    _fields_ = [
        ("data", c_void_p),
        ("batch_stride", c_int64),
        ("head_stride", c_int64),
        ("block_size", c_int32),
        ("num_blocks", c_int32),
    ]


class FwdParams(ctypes.Structure):
    """fa3_fwd_params, in the header's field order."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_enum),
        ("out_dtype", c_enum),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("seqlen_k", c_int32),
        ("heads_q", c_int32),
        ("heads_kv", c_int32),
        ("head_dim_qk", c_int32),
        ("head_dim_v", c_int32),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("out", Tensor),
        ("lse", c_void_p),
        ("softmax_scale", c_float),
        ("causal", c_int32),
        ("window_left", c_int32),
        ("window_right", c_int32),
        ("softcap", c_float),
        ("cu_seqlens_q", c_void_p),
        ("cu_seqlens_k", c_void_p),
        ("seqused_q", c_void_p),
        ("seqused_k", c_void_p),
        ("total_q", c_int32),  # with cu_seqlens_q: rows of the packed Q / O (>= 1)
        ("total_k", c_int32),  # with cu_seqlens_k: rows of the packed K / V (>= 1)
        ("page_table", c_void_p),
        ("page_table_batch_stride", c_int64),
        ("page_size", c_int32),
        ("num_pages", c_int32),
        ("q_descale", c_void_p),
        ("k_descale", c_void_p),
        ("v_descale", c_void_p),
        ("descale_batch_stride", c_int64),
        ("descale_head_stride", c_int64),
        ("num_splits", c_int32),
        ("workspace", c_void_p),
        ("workspace_bytes", c_size_t),
        ("q_block_descale", BlockScales),
        ("k_block_descale", BlockScales),
        ("v_block_descale", BlockScales),
        ("sinks", c_void_p),  # float32 [heads_q] attention-sink logits, or None
        # The KV-cache append with rotary (fa3_c.h): cache_seqlens, new keys/values, rotary tables.
        ("cache_seqlens", c_void_p),
        ("k_new", Tensor),
        ("v_new", Tensor),
        ("seqlen_new", c_int32),
        ("rotary_dim", c_int32),
        ("rotary_cos", c_void_p),
        ("rotary_sin", c_void_p),
        ("rotary_row_stride", c_int64),
        ("rotary_rows", c_int32),
        ("rotary_interleaved", c_int32),
        ("cu_seqlens_new", c_void_p),  # packed new keys: int32 [batch + 1], or None
        ("total_new", c_int32),
        ("leftpad_k", c_void_p),  # int32 [batch]: where each sequence's keys start in its cache rows, or None
        ("rotary_seqlens", c_void_p),  # int32 [batch]: the rotary position of each first new key, or None
        ("sm_margin", c_int32),  # SMs the forward's persistent grid leaves free (0 = none)
    ]


class QuantizeParams(ctypes.Structure):
    """fa3_quantize_params, in the header's field order."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("in_dtype", c_enum),
        ("batch", c_int32),
        ("seqlen", c_int32),
        ("heads", c_int32),
        ("head_dim", c_int32),
        ("in_", Tensor),
        ("out", Tensor),
        ("cu_seqlens", c_void_p),
        ("total", c_int32),
        ("descale", c_void_p),
        ("descale_batch_stride", c_int64),
        ("descale_head_stride", c_int64),
        ("block_size", c_int32),
        ("hadamard", c_int32),
        ("seed", ctypes.c_uint64),
    ]


class BwdParams(ctypes.Structure):
    """fa3_bwd_params, in the header's field order."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("fwd", FwdParams),
        ("dout", Tensor),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("deterministic", c_int32),
        ("workspace", c_void_p),
        ("workspace_bytes", c_size_t),
        ("dsinks", c_void_p),  # float32 [heads_q]: the sinks' gradient, or None
        ("dlse", c_void_p),  # float32, laid out as fwd.lse: the loss's gradient w.r.t. LSE, or None
    ]


class Fa3Error(RuntimeError):
    """A non-zero fa3_status, with the library's message (fa3_last_error) for that call."""

    def __init__(self, code, message):
        self.code = code
        self.message = message
        super().__init__(f"{STATUS_NAMES.get(code, 'status ' + str(code))}: {message}")


def _declare(lib):
    """Sets argtypes/restype for every exported call so that ctypes converts (and checks) arguments."""
    fwd_p, bwd_p = POINTER(FwdParams), POINTER(BwdParams)
    signatures = {
        "fa3_fwd_params_init": ([fwd_p], None),
        "fa3_bwd_params_init": ([bwd_p], None),
        "fa3_fwd_validate": ([fwd_p], c_enum),
        "fa3_fwd_workspace_size": ([fwd_p, POINTER(c_size_t)], c_enum),
        "fa3_forward": ([fwd_p, c_void_p], c_enum),
        "fa3_fwd_kernel_name": ([fwd_p, POINTER(c_char_p)], c_enum),
        "fa3_bwd_validate": ([bwd_p], c_enum),
        "fa3_bwd_workspace_size": ([bwd_p, POINTER(c_size_t)], c_enum),
        "fa3_backward": ([bwd_p, c_void_p], c_enum),
        "fa3_bwd_kernel_name": ([bwd_p, POINTER(c_char_p)], c_enum),
        "fa3_last_error": ([], c_char_p),
        "fa3_fwd_params_size": ([], c_size_t),
        "fa3_quantize_params_init": ([POINTER(QuantizeParams)], None),
        "fa3_quantize_fp8": ([POINTER(QuantizeParams), c_void_p], c_enum),
        "fa3_bwd_params_size": ([], c_size_t),
    }
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def _check_sizes(lib):
    """A struct that disagrees with the library's would corrupt every call: fail loudly instead."""
    for cls, size_fn in ((FwdParams, lib.fa3_fwd_params_size), (BwdParams, lib.fa3_bwd_params_size)):
        ours, theirs = ctypes.sizeof(cls), size_fn()
        if ours != theirs:
            raise RuntimeError(
                f"fa3_ctypes: sizeof({cls.__name__}) is {ours} bytes here but {theirs} in {lib._name}; "
                "bench/fa3_ctypes.py no longer mirrors include/fa3/fa3_c.h -- update its _fields_")


def load(path=None):
    """Opens libfa3.so (path, else $FA3_LIB, else build/release/libfa3.so) and checks the ABI."""
    path = path or os.environ.get("FA3_LIB") or DEFAULT_LIB
    if not os.path.exists(path):
        raise FileNotFoundError(f"fa3_ctypes: {path} not found; build fa3 (build/release) or pass --lib / set FA3_LIB")
    lib = ctypes.CDLL(os.path.abspath(path))
    _declare(lib)
    _check_sizes(lib)
    return lib


def last_error(lib):
    msg = lib.fa3_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(lib, status):
    """Raises Fa3Error for a non-zero status; the message must be read right away (it is per call)."""
    if status != FA3_OK:
        raise Fa3Error(status, last_error(lib))


def new_fwd_params(lib):
    """A params struct with the library's defaults (struct_size, dtype bf16, windows -1)."""
    p = FwdParams()
    lib.fa3_fwd_params_init(byref(p))
    return p


def new_bwd_params(lib):
    p = BwdParams()
    lib.fa3_bwd_params_init(byref(p))
    return p


def kernel_name(lib, params):
    """"hopper" or "reference-gpu": which implementation fa3_forward would run for params."""
    name = c_char_p()
    check(lib, lib.fa3_fwd_kernel_name(byref(params), byref(name)))
    return name.value.decode()


# ------------------------------------------------------------------------------------ torch ----

def _dtype_code(dtype):
    import torch
    codes = {torch.float16: FA3_DTYPE_FP16, torch.bfloat16: FA3_DTYPE_BF16}
    if hasattr(torch, "float8_e4m3fn"):  # older torch builds lack fp8
        codes[torch.float8_e4m3fn] = FA3_DTYPE_E4M3
    if dtype not in codes:
        raise ValueError(f"fa3_ctypes: unsupported dtype {dtype} (fp16, bf16 or float8_e4m3fn)")
    return codes[dtype]


def tensor_view(t, name, packed=False):
    """fa3_tensor of a 4-D [b, s, h, d] torch tensor, or (packed=True, varlen) of a 3-D [total, h, d]
    one whose rows are the sequences one after another; any strides as long as d is contiguous."""
    want = 3 if packed else 4
    if t.dim() != want:
        layout = "3-D [total, heads, head_dim] (varlen: packed rows)" if packed else \
            "4-D [batch, seqlen, heads, head_dim]"
        raise ValueError(f"fa3_ctypes: {name} must be {layout}, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"fa3_ctypes: {name} must have a contiguous last dim, got strides {t.stride()}")
    if packed:  # batch_stride is ignored for varlen: give the extent of the whole tensor
        return Tensor(t.data_ptr(), t.shape[0] * t.stride(0), t.stride(0), t.stride(1))
    return Tensor(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))


def _int32_vector(t, name):
    """Device pointer of a 1-D contiguous int32 CUDA tensor (cu_seqlens_*, seqused_*)."""
    import torch
    if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() or not t.is_cuda:
        raise ValueError(f"fa3_ctypes: {name} must be a contiguous 1-D int32 CUDA tensor, got "
                         f"{t.dtype} shape {tuple(t.shape)} on {t.device}")
    return t.data_ptr()


def _max_seqlen(cu_seqlens):
    """The longest sequence of a cu_seqlens tensor (one device sync: pass max_seqlen_* to avoid it)."""
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item())


def fwd_params(lib, q, k, v, out, lse=None, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0, *,
               cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
               page_table=None, num_splits=None, q_descale=None, k_descale=None, v_descale=None,
               block_descales=None, sinks=None):
    """Fills fa3_fwd_params from torch tensors in BSHD layout.

    Fixed length: q/out [b, s_q, h_q, d_qk / d_v], k/v [b, s_k, h_kv, d_qk / d_v] (d_v may differ
    from d_qk).  Varlen: with cu_seqlens_q (int32 [batch + 1] on the GPU) q and out are packed
    [total_q, h_q, d] and total_q = q.shape[0]; with cu_seqlens_k, k and v are packed [total_k, h_kv, d]
    likewise; max_seqlen_* are the longest sequences (computed from cu_seqlens with a device sync when
    not given); lse is then [h_q, total_q].  seqused_k (int32 [batch]) limits the keys per sequence.
    Paged KV: page_table (int32 [batch, pages per sequence]) with k/v [num_pages, page_size, h_kv, d];
    seqlen_k is then max_seqlen_k, else the table's pages times page_size.
    softcap > 0 maps the scaled scores s to softcap * tanh(s / softcap).
    q/k/v_descale (e4m3 inputs): float32 [b, h_kv] factors the stored values are multiplied by
    (FlashAttention-3's descales; one layout, the strides of q_descale's).
    block_descales (e4m3): {"q" / "k" / "v": (float32 [b, h, blocks] tensor, block_size)}, the block
    descales fa3_quantize_fp8 writes (quantize_fp8 below returns them in this form).
    sinks: float32 [h_q] attention-sink logits (contiguous), or None.
    num_splits (split-KV): None keeps the library's default (0 = automatic), 1 = no split, > 1 = that
    many key splits; it is set before the workspace query, whose size depends on it.

    Shapes come from the tensors; the library validates them (and names the bad argument), so only
    what is needed to read strides is checked here.  A workspace, when the library asks for one, is
    allocated with torch and kept alive as an attribute of the returned struct (as are the int32
    vectors, whose device pointers the struct holds).
    """
    import torch
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"fa3_ctypes: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    varlen_q, varlen_k = cu_seqlens_q is not None, cu_seqlens_k is not None
    p = new_fwd_params(lib)
    p.dtype = _dtype_code(q.dtype)
    p.out_dtype = _dtype_code(out.dtype)
    p.q, p.out = tensor_view(q, "q", varlen_q), tensor_view(out, "out", varlen_q)
    p.k, p.v = tensor_view(k, "k", varlen_k), tensor_view(v, "v", varlen_k)
    p.heads_q, p.head_dim_qk = q.shape[-2], q.shape[-1]
    p.heads_kv, p.head_dim_v = k.shape[-2], v.shape[-1]
    keep = []  # tensors whose device pointers the struct holds
    if varlen_q:
        p.cu_seqlens_q = _int32_vector(cu_seqlens_q, "cu_seqlens_q")
        p.batch = cu_seqlens_q.numel() - 1
        p.seqlen_q = _max_seqlen(cu_seqlens_q) if max_seqlen_q is None else int(max_seqlen_q)
        p.total_q = q.shape[0]
        keep.append(cu_seqlens_q)
    else:
        p.batch, p.seqlen_q = q.shape[0], q.shape[1]
    if varlen_k:
        p.cu_seqlens_k = _int32_vector(cu_seqlens_k, "cu_seqlens_k")
        p.seqlen_k = _max_seqlen(cu_seqlens_k) if max_seqlen_k is None else int(max_seqlen_k)
        p.total_k = k.shape[0]
        keep.append(cu_seqlens_k)
    elif page_table is not None:
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.stride(1) != 1:
            raise ValueError("fa3_ctypes: page_table must be int32 [batch, pages per sequence], rows contiguous")
        p.page_table, p.page_table_batch_stride = page_table.data_ptr(), page_table.stride(0)
        p.page_size, p.num_pages = k.shape[1], k.shape[0]
        p.seqlen_k = page_table.shape[1] * k.shape[1] if max_seqlen_k is None else int(max_seqlen_k)
        keep.append(page_table)
    else:
        p.seqlen_k = k.shape[1]
    if seqused_k is not None:
        p.seqused_k = _int32_vector(seqused_k, "seqused_k")
        keep.append(seqused_k)
    if sinks is not None:
        if sinks.dtype != torch.float32 or sinks.dim() != 1 or not sinks.is_contiguous():
            raise ValueError("fa3_ctypes: sinks must be a contiguous float32 [heads_q] tensor")
        p.sinks = sinks.data_ptr()
        keep.append(sinks)
    if lse is not None:
        if lse.dtype != torch.float32 or not lse.is_contiguous():
            raise ValueError("fa3_ctypes: lse must be a contiguous float32 tensor [batch, heads_q, seqlen_q] "
                             "(varlen: [heads_q, total_q])")
        p.lse = lse.data_ptr()
    p.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)  # 0 = 1/sqrt(d) in the library
    p.causal = int(bool(causal))
    p.window_left, p.window_right = int(window[0]), int(window[1])
    p.softcap = float(softcap)
    if q_descale is not None or k_descale is not None or v_descale is not None:
        for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if t is None:
                continue
            if t.dtype != torch.float32 or t.dim() != 2:
                raise ValueError(f"fa3_ctypes: {name} must be float32 [batch, heads_kv]")
            setattr(p, name, t.data_ptr())
            keep.append(t)
        first = next(t for t in (q_descale, k_descale, v_descale) if t is not None)
        p.descale_batch_stride, p.descale_head_stride = first.stride(0), first.stride(1)
    for name, (t, size) in (block_descales or {}).items():
        if t.dtype != torch.float32 or t.dim() != 3 or t.stride(2) != 1:
            raise ValueError(f"fa3_ctypes: block descales of {name} must be float32 [batch, heads, blocks], "
                             "blocks contiguous")
        setattr(p, name + "_block_descale", BlockScales(t.data_ptr(), t.stride(0), t.stride(1), int(size), t.shape[2]))
        keep.append(t)
    if num_splits is not None:
        p.num_splits = int(num_splits)  # before the workspace query: the split partials live there
    p._keep = keep  # ctypes holds raw pointers only: keep the tensors alive with the struct

    nbytes = c_size_t(0)
    check(lib, lib.fa3_fwd_workspace_size(byref(p), byref(nbytes)))
    if nbytes.value:
        ws = torch.empty(nbytes.value, dtype=torch.uint8, device=q.device)
        p.workspace, p.workspace_bytes = ws.data_ptr(), nbytes.value
        p._workspace = ws  # ctypes holds a raw pointer only: keep the tensor alive with the struct
    return p


def quantize_fp8(lib, x, block_size=128, hadamard=False, seed=0, stream=None):
    """fa3_quantize_fp8 on a 16-bit [b, s, h, d] tensor: (e4m3 tensor, float32 [b, h, blocks] descales).
    Rotate Q and K with the same seed (hadamard=True), V not."""
    import torch
    b, s, h, d = x.shape
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    blocks = (s + block_size - 1) // block_size
    ds = torch.empty(b, h, blocks, dtype=torch.float32, device=x.device)
    p = QuantizeParams()
    lib.fa3_quantize_params_init(byref(p))
    p.in_dtype = _dtype_code(x.dtype)
    p.batch, p.seqlen, p.heads, p.head_dim = b, s, h, d
    p.in_, p.out = tensor_view(x, "in"), tensor_view(out, "out")
    p.descale, p.descale_batch_stride, p.descale_head_stride = ds.data_ptr(), ds.stride(0), ds.stride(1)
    p.block_size, p.hadamard, p.seed = int(block_size), int(bool(hadamard)), int(seed)
    check(lib, lib.fa3_quantize_fp8(byref(p), stream_handle(stream, x.device)))
    return out, ds


def bwd_params(lib, fwd, dout, dq, dk, dv, deterministic=False):
    """Fills fa3_bwd_params around a forward's params (the same q, k, v, out and lse, which must be
    set): dout has out's layout, dq / dk / dv those of q / k / v. The workspace the library asks for
    is allocated with torch and kept alive with the struct."""
    import torch
    p = new_bwd_params(lib)
    p.fwd = fwd
    varlen_q, varlen_k = bool(fwd.cu_seqlens_q), bool(fwd.cu_seqlens_k)
    p.dout, p.dq = tensor_view(dout, "dout", varlen_q), tensor_view(dq, "dq", varlen_q)
    p.dk, p.dv = tensor_view(dk, "dk", varlen_k), tensor_view(dv, "dv", varlen_k)
    p.deterministic = int(bool(deterministic))
    p._keep = [getattr(fwd, "_keep", None), getattr(fwd, "_workspace", None)]
    nbytes = c_size_t(0)
    check(lib, lib.fa3_bwd_workspace_size(byref(p), byref(nbytes)))
    if nbytes.value:
        ws = torch.empty(nbytes.value, dtype=torch.uint8, device=dq.device)
        p.workspace, p.workspace_bytes = ws.data_ptr(), nbytes.value
        p._workspace = ws
    return p


def bwd_kernel_name(lib, params):
    """"hopper" or "reference-gpu": which implementation fa3_backward would run for params."""
    name = c_char_p()
    check(lib, lib.fa3_bwd_kernel_name(byref(params), byref(name)))
    return name.value.decode()


def run_backward(lib, params, stream=None):
    """fa3_backward on prepared params."""
    check(lib, lib.fa3_backward(byref(params), c_void_p(stream_handle(stream))))


def stream_handle(stream, device=None):
    """The cudaStream_t (as int) of None (torch's current stream), a torch stream, or a raw handle."""
    import torch
    if stream is None:
        return torch.cuda.current_stream(device).cuda_stream
    if isinstance(stream, int):
        return stream
    return stream.cuda_stream


def run_forward(lib, params, stream=None):
    """fa3_forward on prepared params: the cheap call to time (no per-call Python setup)."""
    check(lib, lib.fa3_forward(byref(params), c_void_p(stream_handle(stream))))


def forward(lib, q, k, v, out, lse=None, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0,
            stream=None, **varlen):
    """O = attention(q, k, v) into `out` (and `lse`), [b, s, h, d] torch tensors (varlen: packed
    [total, h, d], with the keyword arguments cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    seqused_k of fwd_params; page_table and num_splits likewise go through); raises Fa3Error."""
    p = fwd_params(lib, q, k, v, out, lse, causal, softmax_scale, window, softcap, **varlen)
    handle = stream_handle(stream, q.device)
    ws = getattr(p, "_workspace", None)
    if ws is not None and stream is not None:
        import torch
        # The workspace was allocated on the current stream; tell the allocator another stream uses it.
        ws.record_stream(torch.cuda.ExternalStream(handle))
    run_forward(lib, p, handle)
    return p


# --------------------------------------------------------------------------------- selftest ----

def _fake_valid_params(lib):
    """A valid bf16 problem (b=2, s=128, h=4, d=128) with fake, well-aligned device pointers:
    validation never dereferences them."""
    b, s, h, d = 2, 128, 4, 128
    p = new_fwd_params(lib)
    p.dtype = p.out_dtype = FA3_DTYPE_BF16
    p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv = b, s, s, h, h
    p.head_dim_qk = p.head_dim_v = d
    for i, name in enumerate(("q", "k", "v", "out")):
        setattr(p, name, Tensor(0x100000 + i * 0x100000, s * h * d, h * d, d))
    return p


def selftest(lib):
    """ABI checks that need neither torch nor a GPU. Returns (passed, failed)."""
    results = []

    def expect(name, cond, detail=""):
        results.append(bool(cond))
        print(f"  [{'ok' if cond else 'FAIL'}] {name}" + (f": {detail}" if detail and not cond else ""))

    expect("sizeof(FwdParams) == fa3_fwd_params_size()", ctypes.sizeof(FwdParams) == lib.fa3_fwd_params_size(),
           f"{ctypes.sizeof(FwdParams)} vs {lib.fa3_fwd_params_size()}")
    expect("sizeof(BwdParams) == fa3_bwd_params_size()", ctypes.sizeof(BwdParams) == lib.fa3_bwd_params_size(),
           f"{ctypes.sizeof(BwdParams)} vs {lib.fa3_bwd_params_size()}")

    p = new_fwd_params(lib)
    expect("fa3_fwd_params_init sets struct_size and unbounded windows",
           p.struct_size == ctypes.sizeof(FwdParams) and p.window_left == -1 and p.window_right == -1,
           f"struct_size={p.struct_size} window=({p.window_left}, {p.window_right})")

    st = lib.fa3_fwd_validate(None)
    msg = last_error(lib)
    expect("fa3_fwd_validate(NULL) -> 1 with a message", st == FA3_ERROR_INVALID_ARGUMENT and msg,
           f"status {st}, message {msg!r}")

    st = lib.fa3_bwd_validate(None)
    msg = last_error(lib)
    expect("fa3_bwd_validate(NULL) -> 1 with a message", st == FA3_ERROR_INVALID_ARGUMENT and msg,
           f"status {st}, message {msg!r}")

    p = _fake_valid_params(lib)
    p.batch = 0
    st = lib.fa3_fwd_validate(byref(p))
    msg = last_error(lib)
    expect("batch=0 is rejected naming 'batch'", st != FA3_OK and "batch" in msg, f"status {st}, message {msg!r}")

    p = _fake_valid_params(lib)
    st = lib.fa3_fwd_validate(byref(p))
    msg = last_error(lib)
    expect("a valid problem validates OK (and clears the last error)", st == FA3_OK and msg == "",
           f"status {st}, message {msg!r}")

    # Varlen: checks that total_q / total_k sit where the library reads them (a size check alone
    # would miss two fields out of order).  The cu_seqlens pointers are fake: validation cannot read them.
    b, s, h, d = 2, 128, 4, 128
    p = _fake_valid_params(lib)
    p.cu_seqlens_q, p.cu_seqlens_k = 0x900000, 0xA00000
    p.total_q = p.total_k = b * s
    for name in ("q", "k", "v", "out"):  # packed [total, h, d]
        setattr(p, name, Tensor(getattr(p, name).data, b * s * h * d, h * d, d))
    st = lib.fa3_fwd_validate(byref(p))
    msg = last_error(lib)
    expect("a valid varlen problem (cu_seqlens, total_q/total_k) validates OK", st == FA3_OK and msg == "",
           f"status {st}, message {msg!r}")
    for field in ("total_q", "total_k"):
        saved = getattr(p, field)
        setattr(p, field, 0)
        st = lib.fa3_fwd_validate(byref(p))
        msg = last_error(lib)
        expect(f"varlen with {field}=0 is rejected naming '{field}'", st != FA3_OK and field in msg,
               f"status {st}, message {msg!r}")
        setattr(p, field, saved)

    p = _fake_valid_params(lib)
    try:
        name = kernel_name(lib, p)
        expect("fa3_fwd_kernel_name is 'hopper' or 'reference-gpu'", name in ("hopper", "reference-gpu"), name)
    except Fa3Error as e:
        expect("fa3_fwd_kernel_name is 'hopper' or 'reference-gpu'", False, str(e))

    passed = sum(results)
    return passed, len(results) - passed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--selftest", action="store_true", help="run the ABI checks (no GPU or torch needed)")
    ap.add_argument("--lib", default=None, help="path to libfa3.so (default: $FA3_LIB or build/release/libfa3.so)")
    args = ap.parse_args(argv)
    if not args.selftest:
        ap.print_help()
        return 0
    try:
        lib = load(args.lib)
    except (OSError, RuntimeError) as e:  # missing library or struct mismatch: that is a failure too
        print(f"fa3_ctypes selftest: cannot load the library: {e}")
        print("fa3_ctypes selftest: 0 passed, 1 failed")
        return 1
    passed, failed = selftest(lib)
    print(f"fa3_ctypes selftest: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
