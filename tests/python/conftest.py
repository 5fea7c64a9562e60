"""Make the in-tree package importable, and fail (never skip) when the oracle is missing."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402,F401  (PyTorch is the oracle: an ImportError here fails the run)

# Compiled mods (docs/compile.md) cache their kernels: never in the user's real cache.
import tempfile  # noqa: E402

os.environ["CT_CACHE_DIR"] = tempfile.mkdtemp(prefix="ctorch-test-cache-")
