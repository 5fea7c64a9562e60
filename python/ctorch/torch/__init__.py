"""torch.autograd wrappers over libctorch: drop-ins for PyTorch functions."""
from .loss import linear_cross_entropy, LinearCrossEntropyLoss, cross_entropy

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "cross_entropy"]
