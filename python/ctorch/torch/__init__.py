"""torch.autograd wrappers over libctorch: drop-ins for PyTorch functions."""
from .loss import linear_cross_entropy, LinearCrossEntropyLoss, cross_entropy
from .nn import gelu, silu, swiglu, rms_norm, layer_norm, rope, softmax, log_softmax, logsumexp
from . import index
from .attention import (flex_attention, scaled_dot_product_attention, create_block_mask, create_mask, BlockMask, mask_mods, score_mods, and_masks, or_masks, not_mask, noop_mask, causal_mask)  # noqa: F401

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "cross_entropy",
           "gelu", "silu", "swiglu", "rms_norm", "layer_norm", "rope", "softmax", "log_softmax",
           "logsumexp"]
