"""vector_add reference: out = a + alpha * b (broadcasting), and its backward."""
from __future__ import annotations

from typing import Optional

import torch


def vector_add(a: torch.Tensor, b: torch.Tensor, alpha=1, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.add(a, b, alpha=alpha, out=out)


def vector_add_backward(grad: torch.Tensor, a_shape, b_shape, alpha=1):
    """(grad_a, grad_b), each summed over the dimensions its input was broadcast along."""
    return grad.sum_to_size(a_shape), (grad * alpha).sum_to_size(b_shape)
