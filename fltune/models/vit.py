"""SL-ViT, the vision transformer for small datasets (Lee et al. 2021), as FedSOL's Table 3 trains it: it follows
``Lee-Gihun/FedSOL:train_tools/models/small_vit.py`` with ``train_tools/utils.py``'s ``create_models`` settings (patch
side min(H // 4, 16), no dropout, cls token pooled). Modules are built in their order, so one seed draws their model's
numbers."""

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fltune.models.base import InShape, SplitModel
from fltune.models.registry import register_model

DIM, DEPTH, HEADS, DIM_HEAD, MLP_DIM = 192, 9, 12, 64, 192
"""``create_models``' ViT settings (``dim_head`` is ``small_vit.ViT``'s default)."""

CHANNELS = 3
"""Their ``ViT`` is built for 3 channels and repeats a grayscale input to 3."""

SHIFTS = ((1, -1, 0, 0), (-1, 1, 0, 0), (0, 0, 1, -1), (0, 0, -1, 1))
"""``F.pad`` amounts moving the image one pixel right, left, down and up (cropping the other side)."""


class ShiftedPatchTokens(nn.Module):
    """Shifted Patch Tokenization: the image and its four 1-pixel shifts in p×p patches → LayerNorm → Linear."""

    def __init__(self, patch: int, dim: int, channels: int = CHANNELS) -> None:
        super().__init__()
        self.patch = patch
        patch_dim = (len(SHIFTS) + 1) * channels * patch * patch
        self.norm = nn.LayerNorm(patch_dim)
        self.linear = nn.Linear(patch_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([x, *(F.pad(x, shift) for shift in SHIFTS)], dim=1)
        b, c, h, w = x.shape
        p = self.patch
        # "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", their einops pattern
        patches = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)
        return self.linear(self.norm(patches))


class LocalitySelfAttention(nn.Module):
    """LSA: multi-head self-attention with a learnable log temperature (from 1/√dim_head) and the diagonal
    masked, so no token attends to itself."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        self.temperature = nn.Parameter(torch.log(torch.tensor(dim_head**-0.5)))
        self.attend = nn.Softmax(dim=-1)
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.out = nn.Linear(heads * dim_head, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # each [b, heads, n, d]
        logits = q @ k.transpose(-1, -2) * self.temperature.exp()
        self_pairs = torch.eye(n, dtype=torch.bool, device=x.device)
        attention = self.attend(logits.masked_fill(self_pairs, -torch.finfo(logits.dtype).max))
        return self.out((attention @ v).transpose(1, 2).reshape(b, n, -1))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: ``x + LSA(LN(x))``, then ``x + FF(LN(x))`` with FF = Linear, GELU, Linear."""

    def __init__(self, dim: int, heads: int, dim_head: int, mlp_dim: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = LocalitySelfAttention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ff(self.ff_norm(x))


class SLViTBody(nn.Module):
    """cls + shifted-patch tokens plus positional embeddings (both ~ N(0, 1), as theirs), encoder blocks, the
    cls token's output ``[B, dim]``."""

    def __init__(self, side: int, patch: int) -> None:
        super().__init__()
        self.patches = ShiftedPatchTokens(patch, DIM)
        self.pos_embedding = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, DIM))
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.blocks = nn.Sequential(*(EncoderBlock(DIM, HEADS, DIM_HEAD, MLP_DIM) for _ in range(DEPTH)))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] == 1:
            x = x.repeat(1, CHANNELS, 1, 1)
        tokens = self.patches(x)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + self.pos_embedding
        return self.blocks(tokens)[:, 0]


@register_model("sl_vit")
def sl_vit(in_shape: InShape, num_classes: int) -> SplitModel:
    """Body :class:`SLViTBody`; head their ``mlp_head``, LayerNorm → Linear, kept whole as FedSOL's head-only
    perturbation perturbs that last child, LayerNorm included. No ReLU, so nothing for MAN."""
    c, h, w = in_shape
    if c not in (1, CHANNELS):
        raise ValueError(f"SL-ViT takes 1- or 3-channel images, not {c}")
    patch = min(h // 4, 16)
    if h != w or patch == 0 or h % patch:
        raise ValueError(f"SL-ViT needs square images whose side min(H // 4, 16) = {patch} divides")
    body = SLViTBody(h, patch)
    head = nn.Sequential(OrderedDict(norm=nn.LayerNorm(DIM), linear=nn.Linear(DIM, num_classes)))
    return SplitModel(body, head, feature_dim=DIM)
