"""sigmoid reference: the numerically stable logistic function and its backward from the output."""
from __future__ import annotations

import torch


def _opmath(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) otherwise: one exp(-|x|), never inf or NaN for finite x.

    Half/bfloat16 are computed in float32 and rounded once, like torch.sigmoid.
    """
    xf = _opmath(x)
    e = torch.exp(-xf.abs())
    return torch.where(xf >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).to(x.dtype)


def sigmoid_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """grad * s * (1 - s), from the saved output s."""
    s = _opmath(out)
    return (_opmath(grad) * s * (1.0 - s)).to(torch.promote_types(grad.dtype, out.dtype))
