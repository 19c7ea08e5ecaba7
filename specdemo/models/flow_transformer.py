"""Flow-matching transformer targets: Stable Diffusion 3-class pipelines.

The target network is the pipeline's SD3Transformer2DModel (a velocity v, x_t = (1 - t) x0 + t xi)
with classifier-free guidance folded in as for the latent UNets (latent.GuidedNetwork), its text
conditioning the pooled and sequence embeddings of the pipeline's text encoders, encoded once. It is
sampled with the flow-matching churn kernel on the t grid of the pipeline's
FlowMatchEulerDiscreteScheduler (its shift and sigmas).
"""

from __future__ import annotations

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ..errors import SettingError, SpecdemoError
from ..kernels import FlowChurnKernel
from .latent import TextToImageTarget, load_pipeline

# what a draft network shares with its target's t grid
FLOW_SCHEDULE = ("num_train_timesteps", "shift", "use_dynamic_shifting", "invert_sigmas")


class FlowTransformerTarget(TextToImageTarget):
    """A StableDiffusion3Pipeline: SD3Transformer2DModel + AutoencoderKL + CLIP (and T5) text encoders."""

    kernels = ("flow-churn",)
    family = "Stable Diffusion 3-class flow transformer pipeline"
    denoiser_name, state_argument = "transformer", "hidden_states"

    def __init__(self, name, pipeline):
        super().__init__(name, pipeline)
        self.scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        self.defaults = {"kernel": "flow-churn", "steps": 28, "churn": 0.06, "guidance_scale": 7.0}
        self.max_sequence_length = 256  # T5 tokens of the sequence embeddings (zeros without T5): diffusers' default

    def kernel(self, name, steps, *, eta=None, churn=0.06, gamma=None, prediction=None):
        self.check_kernel(name)
        config = self.scheduler.config
        for option, what in (
            ("use_dynamic_shifting", "shifts its t grid by image size"),
            ("invert_sigmas", "runs its t grid upwards"),
            ("stochastic_sampling", "takes stochastic steps of its own"),
        ):
            if config.get(option):  # the churn kernel would not be this scheduler's chain
                raise SpecdemoError(
                    f"{self.name}'s scheduler {what} ({option}), which specdemo does not support; "
                    "accepted: a FlowMatchEulerDiscreteScheduler with a fixed shift"
                )
        train_steps = self.scheduler.config.num_train_timesteps
        if not 2 <= steps <= train_steps:
            raise SettingError(
                "steps",
                steps,
                f"2..{train_steps}",
                f"--steps {steps} is out of range for {self.name}: accepted 2..{train_steps}",
            )
        return FlowChurnKernel(steps, churn, self.scheduler)

    def encode(self, pipeline, prompt, negative_prompt, guided):
        positive, negative, pooled, negative_pooled = pipeline.encode_prompt(
            prompt,
            None,
            None,
            device=pipeline.transformer.device,
            do_classifier_free_guidance=guided,
            negative_prompt=negative_prompt,
            max_sequence_length=self.max_sequence_length,
        )
        if not guided:
            return {"encoder_hidden_states": positive, "pooled_projections": pooled}
        return {
            "encoder_hidden_states": torch.cat((negative, positive)),
            "pooled_projections": torch.cat((negative_pooled, pooled)),
        }

    def schedule_mismatch(self, other):
        for key in FLOW_SCHEDULE:
            mine, theirs = self.scheduler.config.get(key), other.scheduler.config.get(key)
            if mine != theirs:
                return f"its scheduler's {key} is {theirs!r}, the target's {mine!r}"
        return None


def load(spec: str, where: str, index: dict, cache_only: bool) -> FlowTransformerTarget:
    from diffusers import StableDiffusion3Pipeline  # imports transformers

    return FlowTransformerTarget(spec, load_pipeline(StableDiffusion3Pipeline, where, index, cache_only))
