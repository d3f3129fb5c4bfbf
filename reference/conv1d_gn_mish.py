"""conv1d_gn_mish reference: Diffusion Policy's Conv1dBlock (Conv1d -> GroupNorm -> Mish) and the optional
FiLM / residual epilogue of its conditional residual block, in plain torch.nn.functional."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

#: (Cin, Cout, L) of the Conv1dBlocks of Diffusion Policy's 1D U-Net (down dims 256/512/1024, horizon 16):
#: the card's test and benchmark shapes (examples/diffusion_policy's tests check them against the model)
UNET_CONV_SHAPES = (
    (2, 256, 16), (256, 256, 16),                       # down 0
    (256, 512, 8), (512, 512, 8),                       # down 1
    (512, 1024, 4), (1024, 1024, 4),                    # down 2 and mid
    (2048, 512, 4), (512, 512, 4),                      # up 0
    (1024, 256, 8), (256, 256, 8),                      # up 1 (then the final block at (256, 256, 16))
)


def conv1d_gn_mish(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], gamma: torch.Tensor,
                   beta: torch.Tensor, groups: int = 8, eps: float = 1e-5, scale: Optional[torch.Tensor] = None,
                   shift: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                   impl="auto") -> torch.Tensor:
    """``mish(group_norm(conv1d(x, weight, bias, padding=K//2), groups, gamma, beta, eps))``, then
    ``y * scale[..., None] + shift[..., None]`` (FiLM, (B, Cout) each) and ``+ residual`` (B, Cout, L) when
    given. ``impl`` selects the kernelkit implementation and is ignored here."""
    del impl
    y = F.mish(F.group_norm(F.conv1d(x, weight, bias, padding=weight.shape[-1] // 2), groups, gamma, beta, eps))
    return epilogue(y, scale, shift, residual)


def epilogue(y: torch.Tensor, scale: Optional[torch.Tensor] = None, shift: Optional[torch.Tensor] = None,
             residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Diffusion Policy's FiLM (``scale * y + bias``) and residual add, in its operation order."""
    if scale is not None:
        y = scale[..., None] * y
    if shift is not None:
        y = y + shift[..., None]
    if residual is not None:
        y = y + residual
    return y
