"""Helpers shared by the package's test modules (python/tests is on sys.path: conftest.py)."""

import os

import pytest
import torch

import fa3


def skip_unless_hopper():
    """Skips the calling module unless an sm_90 GPU and fa3's compiled operators are there."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    if not fa3.available():
        # A library named by FA3_TORCH_LIB (the build's test run, tools/gpu-check.sh) that does not
        # load is a broken build, not a reason to skip every GPU test.
        if os.environ.get("FA3_TORCH_LIB"):
            pytest.fail(f"FA3_TORCH_LIB is set but fa3's operators did not load: {fa3._ops.load_error()}",
                        pytrace=False)
        pytest.skip(f"fa3's operators are not built: {fa3._ops.load_error()}", allow_module_level=True)
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a compute capability 9.x GPU", allow_module_level=True)


def rel_err(a, b, floor=1e-3):
    """||a - b|| / ||b|| in float64. floor * sqrt(numel) bounds the denominator from below, so an
    exactly-zero reference (dQ with a single key) does not divide by ~0; floor=0 disables it."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(floor * b.numel() ** 0.5)).item()


def count_calls(monkeypatch, module, **names):
    """Wraps module.<attr> for each key=attr so that every call is counted (the real function runs
    underneath); returns the counts by key. Proves a path ran fa3 rather than a silent fallback."""
    counts = {key: 0 for key in names}
    for key, attr in names.items():
        real = getattr(module, attr)

        def counted(*args, _key=key, _real=real, **kwargs):
            counts[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, attr, counted)
    return counts
