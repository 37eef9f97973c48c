"""fa3: exact attention for NVIDIA Hopper GPUs, for PyTorch.

    import fa3
    out = fa3.flash_attn_func(q, k, v, causal=True)        # FlashAttention-3's interface
    fa3.sdpa.activate()                                    # F.scaled_dot_product_attention -> fa3
    fa3.hf.register()                                      # attn_implementation="fa3"
    fa3.distributed.ring_attn_func(q, k, v, causal=True)   # a sequence split over a process group

The operators are ``torch.ops.fa3.fwd`` / ``bwd`` / ``fwd_kvcache`` / ``combine`` / ``quantize_fp8``
(dispatcher ops with fake kernels, and autograd for fwd: torch.compile, torch.export and CUDA graphs
work through them).
"""

from . import _ops
from . import interface
from .interface import *  # noqa: F401,F403  (flash_attn_interface's functions)

__version__ = "0.1.0"

__all__ = interface.__all__ + ["available"]


def available() -> bool:
    """True when fa3's compiled operators are loaded."""
    return _ops.available()


def __getattr__(name):
    # sdpa, hf and distributed import torch.nn.attention / transformers / torch.distributed: load
    # them on first use only.
    if name in ("sdpa", "hf", "distributed"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fa3' has no attribute {name!r}")
