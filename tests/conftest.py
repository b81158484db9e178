"""Set-up shared by the tests."""

import os

import torch

# Triton kernels run under the interpreter on machines without a GPU; the flag is read when a kernel
# module is first imported, so it is set before any test imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
