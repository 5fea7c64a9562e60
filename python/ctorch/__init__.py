"""ctorch: LLM-training kernels in C, reachable from Python through ctypes.

``ctorch.lib`` is the loaded ``libctorch.so``; ``ctorch.torch`` holds autograd functions
that take and return torch tensors (no copies for contiguous CPU tensors).
"""
from ._lib import CtorchError, lib, status_name, memory_stats, memory_reset_peak, set_num_threads, num_threads

__all__ = ["CtorchError", "lib", "status_name", "memory_stats", "memory_reset_peak",
           "set_num_threads", "num_threads"]
__version__ = lib.ct_version().decode()
