"""The real Hub models the page offers by name: what each is, what it downloads, and which draft pairs
with which. The one list: the model dropdown shows it, the draft dropdown offers its drafts, and it is
the Space's Hub allow-list unless the owner sets SPECDEMO_APP_HUB_MODELS (loading.py).

It lives with the app, not the library: the command line and the Python API take any Hub id or folder
and need no list; these entries are the Space's policy (what it downloads when a visitor picks one, and
the sizes its download cap is checked against).

Sizes are the safetensors files the library downloads (the components of model_index.json it loads:
no safety checker, no fp16 variant, no single-file checkpoint), in the precision the repo stores them.
Checked against the repos' file listings:

- google/ddpm-cifar10-32: diffusion_pytorch_model.safetensors, 143 MB fp32 (35.7 M parameters).
- stable-diffusion-v1-5/stable-diffusion-v1-5: unet 3.44 GB + vae 335 MB + text_encoder 492 MB, fp32.
- nota-ai/bk-sdm-tiny: unet 1.29 GB + vae 335 MB + text_encoder 492 MB, fp32. Its UNet is a
  distilled SD 1.x UNet (0.32 B parameters against 0.86 B) with SD 1.x's VAE, CLIP text encoder and
  noise schedule: the library accepts it as a draft network of Stable Diffusion 1.5 (same latent
  space, text embeddings and schedule; latent.draft_mismatch).
- stabilityai/stable-diffusion-3.5-medium: transformer 4.94 GB + text_encoder 247 MB + text_encoder_2
  1.39 GB + text_encoder_3 (T5-XXL) 9.52 GB + vae 168 MB, 16-bit as stored (fp16); gated on the Hub
  (its licence accepted, and a token).

Left out: google/ddpm-celebahq-256 (455 MB fp32) publishes pickle weights only
(diffusion_pytorch_model.bin), which the library never loads.
"""

from __future__ import annotations

from dataclasses import dataclass

VP_KERNELS = ("ddpm", "ddim", "euler-ancestral")  # the kernels of a DDPM-scheduled model (pixel or latent)
UNET = "unet/diffusion_pytorch_model.safetensors"


@dataclass(frozen=True)
class Curated:
    """A Hub model the page offers by name."""

    repo: str  # the Hub id
    name: str  # what the dropdown calls it
    what: str  # its family and data, in a few words
    download_gb: float  # the weights the Space downloads for it (module docstring)
    precision: str  # how the repo stores them: fp32 or fp16
    kernels: tuple[str, ...]  # its kernels, the first its default
    weights: str  # its denoiser's weights file in the repo: in the server's cache once it is downloaded
    text: bool = False  # text-to-image: the page shows the prompt, negative prompt and guidance scale
    draft: str | None = None  # the Hub id of the draft network that pairs with it (in this list)
    gated: bool = False  # the Hub serves it only to a logged-in user who accepted its licence
    steps: int = 50  # the page's steps for it (the first click must be quick and telling)

    @property
    def size(self) -> str:
        gb = self.download_gb
        return f"{gb * 1000:.0f} MB {self.precision}" if gb < 1 else f"{gb:.1f} GB {self.precision}"

    @property
    def label(self) -> str:
        """The dropdown's label: the model, what it is, its download, its draft, gated."""
        pairs = f" · draft {self.draft.split('/')[-1]}" if self.draft else ""
        return f"{self.name} · {self.what}, {self.size}{pairs}{' · gated' if self.gated else ''}"


CURATED: tuple[Curated, ...] = (
    Curated(
        "google/ddpm-cifar10-32",
        "ddpm-cifar10-32",
        "pixel DDPM, CIFAR-10 32×32",
        0.143,
        "fp32",
        VP_KERNELS,
        "diffusion_pytorch_model.safetensors",
    ),
    Curated(
        "stable-diffusion-v1-5/stable-diffusion-v1-5",
        "stable-diffusion-v1-5",
        "text-to-image 512 px",
        4.27,
        "fp32",
        VP_KERNELS,
        UNET,
        text=True,
        draft="nota-ai/bk-sdm-tiny",
        steps=25,
    ),
    Curated(
        "nota-ai/bk-sdm-tiny",
        "bk-sdm-tiny",
        "distilled SD 1.x, text-to-image 512 px",
        2.12,
        "fp32",
        VP_KERNELS,
        UNET,
        text=True,
        steps=25,
    ),
    Curated(
        "stabilityai/stable-diffusion-3.5-medium",
        "stable-diffusion-3.5-medium",
        "flow transformer 1024 px, churn",
        16.3,
        "fp16",
        ("flow-churn",),
        "transformer/diffusion_pytorch_model.safetensors",
        text=True,
        gated=True,
        steps=28,
    ),
)
BY_REPO = {c.repo: c for c in CURATED}
# the drafts the list pairs, by the Hub id of their draft network
DRAFTS = {c.draft: BY_REPO[c.draft] for c in CURATED if c.draft}


def curated(spec: str) -> Curated | None:
    """The entry of a Hub id on the list, or None."""
    return BY_REPO.get(str(spec or "").strip())


def drafted_by(draft: str) -> list[Curated]:
    """The listed models a draft network pairs with."""
    return [c for c in CURATED if c.draft == draft]
