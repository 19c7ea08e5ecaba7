"""Image samples as pictures: [-1, 1] tensors to uint8 grids (PNG via Pillow)."""

from __future__ import annotations

import math

import numpy as np
import torch


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [-1, 1] -> (B, H, W, C) uint8, as the diffusers pipelines map them."""
    x = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def grid(images: torch.Tensor, columns: int | None = None, pad: int = 1, background: int = 0) -> np.ndarray:
    """A (rows * H, columns * W, C) uint8 mosaic of a batch of images, row-major, `pad` pixels of
    `background` between them (black for a PNG; white on the page's white figures)."""
    tiles = to_uint8(images)
    b, h, w, c = tiles.shape
    columns = columns or math.ceil(math.sqrt(b))
    rows = math.ceil(b / columns)
    out = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, c), background, dtype=np.uint8)
    for i in range(b):
        r, q = divmod(i, columns)
        out[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + q * (w + pad) : pad + q * (w + pad) + w] = tiles[i]
    return out


def save_grid(images: torch.Tensor, path, columns: int | None = None, scale: int = 4) -> None:
    from PIL import Image

    g = grid(images, columns)
    img = Image.fromarray(g[..., 0] if g.shape[-1] == 1 else g)
    img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST).save(path)
