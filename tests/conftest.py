"""Fixtures shared by the tests."""

import os

import torch

# Triton kernels run under the interpreter on machines without a GPU; the flag is read when a kernel
# module is first imported, so it is set before any test imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from .helpers import TINY, Tiny  # noqa: E402


@pytest.fixture(params=TINY)
def tiny(request) -> Tiny:
    return Tiny(request.param)


@pytest.fixture(autouse=True)
def _private_timing_cache(tmp_path, monkeypatch):
    """Each test gets its own timing cache folder: nothing is written to the user's ~/.cache, and no test reads
    timings another test measured (test forms reuse names with other behaviours)."""
    monkeypatch.setenv("DITGATE_CACHE_DIR", str(tmp_path / "ditgate-cache"))
