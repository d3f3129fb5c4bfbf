"""elementwise_mul reference: out = a * b (broadcasting), and its backward."""
from __future__ import annotations

import torch


def elementwise_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b)


def elementwise_mul_backward(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, needs_input_grad=(True, True)):
    """(grad_a, grad_b) = (g * b, g * a), reduced to each input's shape; None where not needed."""
    grad_a = (grad * b).sum_to_size(a.shape) if needs_input_grad[0] else None
    grad_b = (grad * a).sum_to_size(b.shape) if needs_input_grad[1] else None
    return grad_a, grad_b
