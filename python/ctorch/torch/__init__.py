"""torch.autograd wrappers over libctorch: drop-ins for PyTorch functions."""
from .loss import linear_cross_entropy, LinearCrossEntropyLoss, cross_entropy
from .nn import gelu, silu, swiglu, rms_norm, layer_norm, rope
from . import index

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "cross_entropy",
           "gelu", "silu", "swiglu", "rms_norm", "layer_norm", "rope"]
