"""Small things several test modules build: tiny diffusers pipelines saved as safetensors, free ports."""

import socket

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel


def tiny_unet(prediction: str = "epsilon", classes: int | None = None, channels: int = 1, seed: int = 0) -> UNet2DModel:
    """A random 8x8 UNet2DModel (two levels, no attention); prediction is recorded by the scheduler."""
    torch.manual_seed(seed)
    return UNet2DModel(sample_size=8, in_channels=channels, out_channels=channels, block_out_channels=(8, 16),
                       layers_per_block=1, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4, num_class_embeds=classes)


def tiny_pipeline_folder(path, classes: int | None = 10, seed: int = 0, **scheduler) -> str:
    """A tiny UNet and its DDPMScheduler saved as a diffusers pipeline folder (the Hub layout)."""
    DDPMPipeline(unet=tiny_unet(classes=classes, seed=seed), scheduler=DDPMScheduler(**scheduler)).save_pretrained(
        str(path), safe_serialization=True)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
