"""Diffusion Policy's 1D conditional U-Net, in pure PyTorch.

The network follows ``diffusion_policy/model/diffusion/conditional_unet1d.py`` (Chi et al.): a
ConditionalResidualBlock1D is two Conv1dBlocks (Conv1d -> GroupNorm(8) -> Mish) with FiLM conditioning
(scale and bias from the diffusion-step embedding concatenated with the global observation condition)
between them and a 1x1 residual convolution; down dims 256/512/1024, kernel size 5, horizon 16, action
dim 2, Downsample1d = Conv1d(k=3, s=2, p=1), Upsample1d = ConvTranspose1d(k=4, s=2, p=1). Parameter names
match the original (a checkpoint loads with ``load_state_dict``).

The fused kernel plugs in without this module importing kernelkit: :meth:`ConditionalUnet1D.set_conv_block_op`
takes a function with the signature of ``kernelkit.reference.conv1d_gn_mish.conv1d_gn_mish`` (each
Conv1dBlock then calls it, with the FiLM and residual of its block fused in); ``surgery.use_kernelkit``
wires it.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from kernelkit.reference.conv1d_gn_mish import epilogue

ConvBlockOp = Callable[..., torch.Tensor]


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish; ``forward`` also applies the optional FiLM (``scale * y + shift``) and
    residual (``+ residual``) of the surrounding block, through ``op`` when one is set."""

    def __init__(self, inp_channels: int, out_channels: int, kernel_size: int, n_groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(inp_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )
        self.op: Optional[ConvBlockOp] = None

    def forward(self, x, scale=None, shift=None, residual=None):
        if self.op is not None:
            conv, gn = self.block[0], self.block[1]
            return self.op(x, conv.weight, conv.bias, gn.weight, gn.bias, gn.num_groups, gn.eps, scale, shift, residual)
        return epilogue(self.block(x), scale, shift, residual)


class Downsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Upsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x):
        return self.conv(x)


class ConditionalResidualBlock1D(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int = 3, n_groups: int = 8,
                 cond_predict_scale: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList([
            Conv1dBlock(in_channels, out_channels, kernel_size, n_groups=n_groups),
            Conv1dBlock(out_channels, out_channels, kernel_size, n_groups=n_groups),
        ])
        self.cond_predict_scale = cond_predict_scale
        self.out_channels = out_channels
        cond_channels = out_channels * 2 if cond_predict_scale else out_channels
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cond_channels))  # + Rearrange('b t -> b t 1')
        self.residual_conv = nn.Conv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        embed = self.cond_encoder(cond)
        if self.cond_predict_scale:
            embed = embed.reshape(embed.shape[0], 2, self.out_channels)
            scale, shift = embed[:, 0], embed[:, 1]
        else:
            scale, shift = None, embed
        out = self.blocks[0](x, scale, shift)
        return self.blocks[1](out, residual=self.residual_conv(x))


class ConditionalUnet1D(nn.Module):
    def __init__(self, input_dim: int = 2, global_cond_dim: Optional[int] = 40, diffusion_step_embed_dim: int = 256,
                 down_dims: Sequence[int] = (256, 512, 1024), kernel_size: int = 5, n_groups: int = 8,
                 cond_predict_scale: bool = True):
        super().__init__()
        all_dims = [input_dim] + list(down_dims)
        start_dim = down_dims[0]
        dsed = diffusion_step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(
            SinusoidalPosEmb(dsed), nn.Linear(dsed, dsed * 4), nn.Mish(), nn.Linear(dsed * 4, dsed))
        cond_dim = dsed + (global_cond_dim or 0)
        in_out = list(zip(all_dims[:-1], all_dims[1:]))
        mid_dim = all_dims[-1]

        def crb(cin, cout):
            return ConditionalResidualBlock1D(cin, cout, cond_dim=cond_dim, kernel_size=kernel_size, n_groups=n_groups,
                                              cond_predict_scale=cond_predict_scale)

        self.mid_modules = nn.ModuleList([crb(mid_dim, mid_dim), crb(mid_dim, mid_dim)])
        self.down_modules = nn.ModuleList()
        for ind, (dim_in, dim_out) in enumerate(in_out):
            is_last = ind >= (len(in_out) - 1)
            self.down_modules.append(nn.ModuleList([
                crb(dim_in, dim_out), crb(dim_out, dim_out), Downsample1d(dim_out) if not is_last else nn.Identity()]))
        self.up_modules = nn.ModuleList()
        for ind, (dim_in, dim_out) in enumerate(reversed(in_out[1:])):
            is_last = ind >= (len(in_out) - 1)
            self.up_modules.append(nn.ModuleList([
                crb(dim_out * 2, dim_in), crb(dim_in, dim_in), Upsample1d(dim_in) if not is_last else nn.Identity()]))
        self.final_conv = nn.Sequential(Conv1dBlock(start_dim, start_dim, kernel_size=kernel_size),
                                        nn.Conv1d(start_dim, input_dim, 1))

    def set_conv_block_op(self, op: Optional[ConvBlockOp]) -> "ConditionalUnet1D":
        """Route every Conv1dBlock through ``op`` (signature of ``reference.conv1d_gn_mish.conv1d_gn_mish``), or back to
        nn.Conv1d/GroupNorm/Mish with None."""
        for m in self.modules():
            if isinstance(m, Conv1dBlock):
                m.op = op
        return self

    def forward(self, sample: torch.Tensor, timestep, global_cond: Optional[torch.Tensor] = None) -> torch.Tensor:
        """sample (B, T, input_dim); timestep an int or a 0-d / (B,) tensor (device tensors need no host
        sync); global_cond (B, global_cond_dim). Returns the predicted noise, (B, T, input_dim)."""
        sample = sample.moveaxis(-1, -2)
        timesteps = timestep
        if not torch.is_tensor(timesteps):
            timesteps = torch.tensor([timesteps], dtype=torch.long, device=sample.device)
        elif timesteps.dim() == 0:
            timesteps = timesteps[None].to(sample.device)
        timesteps = timesteps.expand(sample.shape[0])
        global_feature = self.diffusion_step_encoder(timesteps)
        if global_cond is not None:
            global_feature = torch.cat([global_feature, global_cond], dim=-1)
        x = sample
        h: List[torch.Tensor] = []
        for resnet, resnet2, downsample in self.down_modules:
            x = resnet(x, global_feature)
            x = resnet2(x, global_feature)
            h.append(x)
            x = downsample(x)
        for mid_module in self.mid_modules:
            x = mid_module(x, global_feature)
        for resnet, resnet2, upsample in self.up_modules:
            x = torch.cat((x, h.pop()), dim=1)
            x = resnet(x, global_feature)
            x = resnet2(x, global_feature)
            x = upsample(x)
        x = self.final_conv(x)
        return x.moveaxis(-1, -2)


def make_unet(seed: int = 0, device=None, **kwargs) -> ConditionalUnet1D:
    """The U-Net with PyTorch's default init drawn from ``seed`` (the global RNG is left untouched), in
    eval mode. GroupNorm affine parameters are perturbed (1 + N(0, 0.1^2), N(0, 0.1^2)) so they matter."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ConditionalUnet1D(**kwargs)
        for m in model.modules():
            if isinstance(m, nn.GroupNorm):
                with torch.no_grad():
                    m.weight.add_(torch.randn_like(m.weight) * 0.1)
                    m.bias.add_(torch.randn_like(m.bias) * 0.1)
    return model.eval().to(device) if device is not None else model.eval()


def conv_block_shapes(model: ConditionalUnet1D, horizon: int = 16, batch: int = 1,
                      global_cond_dim: int = 40) -> List[Tuple[int, int, int]]:
    """(Cin, Cout, L) of each Conv1dBlock call in one forward pass, in call order (runs on the model's device)."""
    shapes: List[Tuple[int, int, int]] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: shapes.append(
        (args[0].shape[1], mod.block[0].out_channels, args[0].shape[2])))
        for m in model.modules() if isinstance(m, Conv1dBlock)]
    p = next(model.parameters())
    input_dim = model.final_conv[1].out_channels
    try:
        with torch.no_grad():
            model(torch.zeros(batch, horizon, input_dim, device=p.device), 0,
                  torch.zeros(batch, global_cond_dim, device=p.device) if global_cond_dim else None)
    finally:
        for hk in hooks:
            hk.remove()
    return shapes
