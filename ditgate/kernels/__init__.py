"""Our own Triton kernels (imported lazily: a missing Triton is a reason, never an import error)."""
