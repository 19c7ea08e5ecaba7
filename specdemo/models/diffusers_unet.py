"""diffusers UNet2DModel targets and drafts: a Hub id or a local folder, safetensors only.

The kernel's tables come from the model's own DDPMScheduler or DDIMScheduler config, and the
network is called once per batch of rows that each carry their own timestep (and class label).
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import torch
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel

from ..errors import SpecdemoError
from ..kernels import DDIMKernel, DDPMKernel, Kernel
from .base import Target

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "models"
EMBEDDED = {"digits": ASSETS / "digits", "digits-draft": ASSETS / "digits-draft"}
HOW_TO_GET = "download it where there is internet (`hf download {spec} --local-dir DIR`) and pass --model DIR"


class UNetNetwork:
    """net(x [R, C, H, W], n [R], class_labels [R]) -> the UNet's output at timesteps[n], per row."""

    def __init__(self, unet: UNet2DModel, kernel: Kernel):
        self.unet, self.kernel = unet, kernel
        self.dtype = unet.dtype
        self.timesteps = kernel.timesteps.to(unet.device)

    def __call__(self, x: torch.Tensor, n: torch.Tensor, class_labels: torch.Tensor | None = None) -> torch.Tensor:
        t = self.timesteps[n]
        out = self.unet(x.to(self.dtype), t, class_labels=class_labels).sample
        return out[:, : x.shape[1]].to(x.dtype)  # learned-variance models append C variance channels


class DiffusersTarget(Target):
    """A UNet2DModel and its scheduler config; runs the ddpm or ddim kernel at any step count."""

    kernels = ("ddpm", "ddim")

    def __init__(self, name: str, unet: UNet2DModel, scheduler_config: dict):
        self.name, self.unet, self.scheduler_config = name, unet.eval().requires_grad_(False), scheduler_config
        cfg = unet.config
        size = cfg.sample_size if isinstance(cfg.sample_size, (tuple, list)) else (cfg.sample_size,) * 2
        self.shape = (cfg.in_channels, *size)
        self.num_classes = cfg.num_class_embeds
        self.defaults = {"kernel": "ddpm", "steps": 100}
        self._moved: dict = {}

    def kernel(self, name, steps, *, eta=1.0, churn=None, gamma=None, prediction=None):
        self.check_kernel(name)
        train_steps = self.scheduler_config.get("num_train_timesteps", 1000)
        if not 1 <= steps <= train_steps:
            raise SpecdemoError(f"--steps {steps} is out of range for {self.name}: accepted 1..{train_steps}")
        if name == "ddpm":
            return DDPMKernel(DDPMScheduler.from_config(self.scheduler_config), steps)
        return DDIMKernel(DDIMScheduler.from_config(self.scheduler_config), steps, eta)

    def network(self, kernel, device=torch.device("cpu"), dtype=None):
        """fp32 on CPU; fp16 on CUDA unless dtype says otherwise."""
        device = torch.device(device)
        dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
        key = (device, dtype)
        if key not in self._moved:  # one copy per placement: concurrent runs may use cpu and cuda
            placed = copy.deepcopy(self.unet).to(device)
            self._moved[key] = placed if placed.dtype == dtype else placed.to(dtype)
        return UNetNetwork(self._moved[key], kernel)

    def same_process(self, other: "DiffusersTarget") -> bool:
        """Whether `other` can draft for this target: same shape, classes and noise schedule."""
        keys = ("num_train_timesteps", "beta_schedule", "beta_start", "beta_end", "prediction_type")
        return (other.shape == self.shape and other.num_classes == self.num_classes
                and all(other.scheduler_config.get(k) == self.scheduler_config.get(k) for k in keys))


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~"))


def load_diffusers_target(spec: str, hub_only: bool = False) -> DiffusersTarget:
    """Load a UNet2DModel and its scheduler config from an embedded name, a folder or a Hub id.

    safetensors only (use_safetensors=True: pickle weights are never loaded), no remote code.
    A pipeline folder (model_index.json, unet/, scheduler/) and a bare model folder (config.json
    and scheduler_config.json side by side) are both accepted.
    """
    if hub_only and spec not in EMBEDDED:  # never the local disk: a Hub id, or refused just below
        source, local = Path(spec), False
    else:
        source = Path(EMBEDDED.get(spec, Path(spec).expanduser()))
        local = source.is_dir()
    if not local and not _looks_like_hub_id(spec):
        raise SpecdemoError(f"unknown model {spec!r}: not a preset, a mixture .json file, a folder or a Hub id (org/name)")
    where = str(source) if local else spec
    cache_only = not local and not _hub_answers(spec)
    try:
        with warnings.catch_warnings():  # diffusers passes huggingface_hub a deprecated argument
            warnings.simplefilter("ignore")
            pipeline_layout = (source / "unet").is_dir() if local else _hub_has_pipeline(spec, cache_only)
            sub = "unet" if pipeline_layout else None
            unet = UNet2DModel.from_pretrained(where, subfolder=sub, use_safetensors=True, local_files_only=cache_only)
            scheduler = DDPMScheduler.load_config(where, subfolder="scheduler" if pipeline_layout else None,
                                                  local_files_only=cache_only)
    except Exception as err:  # offline, unknown repo, missing or pickle-only weights, bad config
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if local:
            hint = "the folder needs model_index.json with unet/ and scheduler/, or config.json, scheduler_config.json and safetensors weights"
        elif _offline():
            hint = f"the Hub is offline here (HF_HUB_OFFLINE) and it is not in the local cache; {HOW_TO_GET.format(spec=spec)}"
        elif cache_only:
            hint = f"the Hub does not answer from here and it is not in the local cache; {HOW_TO_GET.format(spec=spec)}"
        else:
            hint = f"the Hub may be unreachable, or the repo lacks safetensors weights; {HOW_TO_GET.format(spec=spec)}"
        raise SpecdemoError(f"cannot load model {spec!r} ({reason}); {hint}") from None
    return DiffusersTarget(spec, unet, dict(scheduler))


HUB_TIMEOUT = 5.0  # seconds for the one request that tells whether the Hub answers


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _hub_answers(repo_id: str) -> bool:
    """One short request before any download: True when the Hub answers for repo_id; False when it
    does not (offline: then only the local cache is read, at once, where the downloads would retry for
    about a minute); a repo the Hub does not have is refused here."""
    if _offline():
        return False
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=HUB_TIMEOUT)
    except HFValidationError:
        raise SpecdemoError(f"{repo_id[:80]!r} is not a valid Hub id (org/name: letters, digits, '-', '_', '.')") from None
    except GatedRepoError:
        raise SpecdemoError(f"model {repo_id!r} is gated on the Hub: accept its terms and log in, or pass a local "
                            "folder") from None
    except RepositoryNotFoundError:
        raise SpecdemoError(f"no model {repo_id!r} on the Hub (or it is private); check the id") from None
    except Exception:  # no network, DNS, timeout, a proxy's error page: read the cache only
        return False
    return True


def _hub_has_pipeline(repo_id: str, cache_only: bool) -> bool:
    """Whether a Hub repo is a pipeline (model_index.json with a unet/ subfolder)."""
    from huggingface_hub import hf_hub_download

    try:
        index = json.loads(Path(hf_hub_download(repo_id, "model_index.json", local_files_only=cache_only)).read_text())
    except Exception:
        return False
    return "unet" in index
