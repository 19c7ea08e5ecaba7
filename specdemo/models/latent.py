"""Latent text-to-image targets: Stable Diffusion 1.x/2.x-class pipelines.

The target network is the pipeline's UNet2DConditionModel with classifier-free guidance folded in:
at guidance weight w > 1 each node's output is eps_u + w (eps_c - eps_u), its unconditional
(negative prompt) and conditional rows evaluated in the same batched UNet call. Sampling runs in
the latent space of the pipeline's AutoencoderKL (shape: latent channels x latent size); the VAE
decodes only for display. The ddpm, ddim and euler-ancestral kernels come from the pipeline's scheduler
config; the default is euler-ancestral when the pipeline's scheduler is EulerAncestralDiscreteScheduler.

transformers (the text encoders) is imported only when such a pipeline is loaded.
"""

from __future__ import annotations

import threading

import torch

from .base import Target
from .diffusers_unet import VP_KERNELS, default_vp_kernel, placed, schedule_mismatch, skipped_components, vp_kernel

# text encoders' settings a draft must share with its target: it reads the target's prompt embeddings
TEXT_ENCODER_KEYS = ("hidden_size", "projection_dim", "num_hidden_layers", "vocab_size", "max_position_embeddings")
VAE_KEYS = (
    "latent_channels",
    "scaling_factor",
    "shift_factor",
    "block_out_channels",
    "layers_per_block",
    "down_block_types",
    "up_block_types",
    "in_channels",
    "out_channels",
)


class GuidedNetwork:
    """net(x [R, *shape], n [R], guidance_scale [R], **text) -> the denoiser's output at timesteps[n]
    with classifier-free guidance, per row.

    Every text entry is (R, G, ...) in the denoiser's own keyword (encoder_hidden_states,
    pooled_projections): G = 2 holds the negative prompt's then the prompt's embeddings, and the
    denoiser sees the R rows twice in one call, unconditional rows first as diffusers batches them;
    G = 1 (w = 1, no guidance) is one row per node.
    """

    def __init__(self, denoiser, kernel, state_argument: str):
        self.denoiser, self.state_argument = denoiser, state_argument
        self.dtype = denoiser.dtype
        self.timesteps = kernel.timesteps.to(denoiser.device)

    def __call__(
        self, x: torch.Tensor, n: torch.Tensor, guidance_scale: torch.Tensor | None = None, **text: torch.Tensor
    ) -> torch.Tensor:
        groups = next(iter(text.values())).shape[1]
        rows = x.to(self.dtype).repeat(groups, *[1] * (x.dim() - 1))
        t = self.timesteps[n].repeat(groups)
        text = {k: v.transpose(0, 1).flatten(0, 1) for k, v in text.items()}  # (G R, ...): group-major
        out = self.denoiser(**{self.state_argument: rows}, timestep=t, **text).sample.to(x.dtype)
        if groups == 1:
            return out
        assert guidance_scale is not None  # G = 2: guided, with each row's weight
        unconditional, conditional = out.chunk(2)
        w = guidance_scale.to(x.dtype).view(-1, *[1] * (x.dim() - 1))
        return torch.addcmul(unconditional, w, conditional - unconditional)


class TextToImageTarget(Target):
    """A diffusers text-to-image pipeline, loaded once (fp32 on the CPU) and placed once per device
    and dtype; prompts encoded once per setting (the last one kept); decode() for display."""

    takes_draft_networks = True
    text_conditioned = True
    family: str
    denoiser_name: str  # the pipeline's component that is the target network
    state_argument: str  # the denoiser's keyword for the noisy state

    def __init__(self, name: str, pipeline):
        self.name, self.pipeline = name, pipeline
        pipeline.set_progress_bar_config(disable=True)
        for module in pipeline.components.values():
            if isinstance(module, torch.nn.Module):
                module.eval().requires_grad_(False)
        cfg = self.denoiser.config
        size = cfg.sample_size if isinstance(cfg.sample_size, (tuple, list)) else (cfg.sample_size,) * 2
        self.shape = (cfg.in_channels, *size)
        self.scheduler_config = dict(pipeline.scheduler.config)
        self._moved: dict = {}
        self._encoded: dict = {}
        self._lock = threading.RLock()  # encoding and placing, for concurrent runs (encoding places)

    @property
    def denoiser(self):
        return getattr(self.pipeline, self.denoiser_name)

    def placed(self, device, dtype=None):
        """The pipeline on `device` in `dtype` (fp32 on CPU, fp16 on CUDA)."""
        with self._lock:  # one copy per placement, even when two runs ask at once
            return placed(self.pipeline, self._moved, device, dtype)

    def place(self, device, dtype=None):
        self.placed(device, dtype)

    def network(self, kernel, device=torch.device("cpu"), dtype=None):
        return GuidedNetwork(getattr(self.placed(device, dtype), self.denoiser_name), kernel, self.state_argument)

    def encode(self, pipeline, prompt: str, negative_prompt: str, guided: bool) -> dict[str, torch.Tensor]:
        """The text entries of GuidedNetwork for one prompt: each (G, ...), G = 2 when guided."""
        raise NotImplementedError

    def prompt_conditioning(
        self, prompt: str, negative_prompt: str, guidance_scale: float, num_samples: int, device, dtype=None
    ) -> dict[str, torch.Tensor]:
        """Each trajectory's conditioning (the driver's cond): the prompt encoded once, its rows views
        of that one encoding, and the guidance weight w when w > 1."""
        device = torch.device(device)
        guided = guidance_scale > 1
        key = (prompt, negative_prompt, guided, device, dtype)
        with self._lock:  # the app's concurrent runs: one encoding, read from what this call holds
            encoded = self._encoded.get(key)
            if encoded is None:  # the runs of one click share the encoding; the last one is kept
                with torch.inference_mode():
                    encoded = self.encode(self.placed(device, dtype), prompt, negative_prompt, guided)
                self._encoded = {key: encoded}
        cond = {k: v[None].expand(num_samples, *v.shape) for k, v in encoded.items()}
        if guided:
            cond["guidance_scale"] = torch.full((num_samples,), float(guidance_scale), device=device)
        return cond

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [-1, 1] from latents (B, *shape), by the VAE: x = decode(z / scaling_factor
        + shift_factor), as the pipeline decodes; for display only."""
        vae = self.placed(latents.device).vae
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        with torch.inference_mode():
            z = latents.to(vae.dtype) / vae.config.scaling_factor + shift
            return vae.decode(z).sample.float().clamp(-1, 1)

    def draft_mismatch(self, other):
        """A draft network needs the target's latent shape and VAE, its noise schedule and prediction
        type, and its text encoders (it reads the target's prompt embeddings)."""
        if type(other) is not type(self):
            return f"it is not a {self.family}"
        if other.shape != self.shape:
            return f"its latent shape {other.shape} differs from the target's {self.shape}"
        for key in VAE_KEYS:
            mine, theirs = self.pipeline.vae.config.get(key), other.pipeline.vae.config.get(key)
            if mine != theirs:
                return f"its VAE's {key} is {theirs!r}, the target's {mine!r}: another latent space"
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
            mine, theirs = _text_encoder_signature(self.pipeline, name), _text_encoder_signature(other.pipeline, name)
            if mine != theirs:
                return f"its {name} ({theirs}) differs from the target's ({mine})"
        return self.schedule_mismatch(other)

    def schedule_mismatch(self, other) -> str | None:
        raise NotImplementedError


def _text_encoder_signature(pipeline, name: str) -> dict | None:
    encoder = getattr(pipeline, name, None)
    if encoder is None:
        return None
    return {"class": type(encoder).__name__, **{k: getattr(encoder.config, k, None) for k in TEXT_ENCODER_KEYS}}


def load_pipeline(pipeline_class, where: str, index: dict, cache_only: bool):
    """A pipeline from a folder or Hub id: safetensors only, components the index leaves out (and a
    safety checker) not loaded, no remote code."""
    absent = dict.fromkeys(skipped_components(index))
    if "safety_checker" in index:
        absent.update(requires_safety_checker=False)
    return pipeline_class.from_pretrained(where, use_safetensors=True, local_files_only=cache_only, **absent)


class LatentUNetTarget(TextToImageTarget):
    """A StableDiffusionPipeline: UNet2DConditionModel + AutoencoderKL + CLIP text encoder; ddpm, ddim or
    euler-ancestral."""

    kernels = VP_KERNELS
    family = "Stable Diffusion 1.x/2.x latent text-to-image pipeline"
    denoiser_name, state_argument = "unet", "sample"

    def __init__(self, name, pipeline):
        super().__init__(name, pipeline)
        self.defaults = {
            "kernel": default_vp_kernel(type(pipeline.scheduler).__name__),
            "steps": 50,
            "guidance_scale": 7.5,
        }

    def kernel(self, name, steps, *, eta=1.0, churn=None, gamma=None, prediction=None):
        self.check_kernel(name)
        return vp_kernel(self.name, self.scheduler_config, name, steps, eta)

    def encode(self, pipeline, prompt, negative_prompt, guided):
        positive, negative = pipeline.encode_prompt(prompt, pipeline.unet.device, 1, guided, negative_prompt)
        return {"encoder_hidden_states": torch.cat((negative, positive)) if guided else positive}

    def schedule_mismatch(self, other):
        return schedule_mismatch(self.scheduler_config, other.scheduler_config)


def load(spec: str, where: str, index: dict, cache_only: bool) -> LatentUNetTarget:
    from diffusers import StableDiffusionPipeline  # imports transformers

    return LatentUNetTarget(spec, load_pipeline(StableDiffusionPipeline, where, index, cache_only))
