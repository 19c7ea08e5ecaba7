"""Kernels and schedules: network output + state + step -> Gaussian mean; step -> scale."""

from .base import Kernel
from .ddim import DDIMKernel
from .ddpm import DDPMKernel, default_ddpm_scheduler
from .euler_ancestral import EulerAncestralKernel
from .flow import FlowChurnKernel
from .langevin import LangevinKernel
from .vp import VPKernel

__all__ = [
    "Kernel",
    "VPKernel",
    "DDPMKernel",
    "DDIMKernel",
    "EulerAncestralKernel",
    "FlowChurnKernel",
    "LangevinKernel",
    "default_ddpm_scheduler",
]
