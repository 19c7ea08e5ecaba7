"""What the sampler needs from a model: a shape, kernels it supports, and its network per kernel.

A network is any callable net(x [R, *shape], n [R] step indices, **cond) -> output [R, *shape] in
kernel.prediction_type: every row carries its own state and step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SpecdemoError
from ..kernels import Kernel

if TYPE_CHECKING:
    import torch


class Target:
    """A target model. `defaults` are the kernel settings it is meant for (CLI flag names)."""

    name: str
    shape: tuple[int, ...]
    kernels: tuple[str, ...]
    defaults: dict
    num_classes: int | None = None
    takes_draft_networks = False  # whether another model's network may draft for it (draft_mismatch)
    text_conditioned = False  # whether it reads a prompt (prompt_conditioning)

    def kernel(self, name: str, steps: int, *, eta: float, churn: float, gamma: float, prediction: str) -> Kernel:
        raise NotImplementedError

    def network(self, kernel: Kernel, device=None, dtype=None):
        """The network for `kernel`, on `device` (analytic networks follow their inputs)."""
        raise NotImplementedError

    def place(self, device, dtype=None) -> None:
        """Put the networks on `device` now, as later runs there take them (ZeroGPU asks for its models on
        the GPU before its first task); analytic networks have nothing to place."""

    def draft_mismatch(self, other: Target) -> str | None:
        """Why `other`'s network cannot draft for this target, or None when it can (targets that
        take draft networks only)."""
        raise NotImplementedError

    def prompt_conditioning(
        self, prompt: str, negative_prompt: str, guidance_scale: float, num_samples: int, device, dtype=None
    ) -> dict[str, torch.Tensor]:
        """Each trajectory's conditioning from the prompt (text-conditioned targets only)."""
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] from latents (text-conditioned targets only)."""
        raise NotImplementedError

    def check_kernel(self, name: str) -> None:
        if name not in self.kernels:
            raise SpecdemoError(f"{self.name} runs with the {' or '.join(self.kernels)} kernel, not {name!r}")

    def describe(self) -> dict:
        return {
            "model": self.name,
            "shape": list(self.shape),
            "kernels": list(self.kernels),
            "num_classes": self.num_classes,
            "defaults": self.defaults,
        }
