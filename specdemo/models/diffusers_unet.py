"""diffusers models from a Hub id or a local folder, safetensors only: UNet2DModel targets and drafts
here; text-to-image pipelines (latent.py, flow_transformer.py) told apart by their model_index.json.

The kernel's tables come from the model's own scheduler config (read as a DDPMScheduler, DDIMScheduler
or EulerAncestralDiscreteScheduler), and the network is called once per batch of rows that each carry
their own timestep (and class label).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import warnings
from pathlib import Path

import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerAncestralDiscreteScheduler, UNet2DModel

from ..config import EMBEDDED_NAMES
from ..errors import ModelLoadError, SettingError, SpecdemoError
from ..kernels import DDIMKernel, DDPMKernel, EulerAncestralKernel, Kernel
from .base import Target

ASSETS = Path(__file__).resolve().parent / "embedded"  # the embedded models, shipped inside the package
EMBEDDED = {name: ASSETS / name for name in EMBEDDED_NAMES}
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


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU, fp16 on CUDA."""
    return torch.float16 if device.type == "cuda" else torch.float32


def placed(module, copies: dict, device, dtype=None):
    """`module` (loaded in fp32 on the CPU) on `device` in `dtype` (default_dtype): the module itself
    there, else one moved copy per placement kept in `copies` (concurrent runs may use cpu and cuda)."""
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    if device.type == "cpu" and dtype == torch.float32:
        return module
    key = (device, dtype)
    if key not in copies:
        copies[key] = copy.deepcopy(module).to(device, dtype)
    return copies[key]


VP_KERNELS = ("ddpm", "ddim", "euler-ancestral")  # the kernels of a VP model's scheduler config


def default_vp_kernel(scheduler_class: str | None) -> str:
    """A VP model's default kernel: euler-ancestral when its own scheduler is EulerAncestralDiscreteScheduler,
    else ddpm."""
    return "euler-ancestral" if scheduler_class == "EulerAncestralDiscreteScheduler" else "ddpm"


def vp_kernel(model: str, scheduler_config: dict, name: str, steps: int, eta: float) -> Kernel:
    """The ddpm, ddim or euler-ancestral kernel of a model's own scheduler config, at `steps` steps."""
    train_steps = scheduler_config.get("num_train_timesteps", 1000)
    if not 1 <= steps <= train_steps:
        raise SettingError(
            "steps",
            steps,
            f"1..{train_steps}",
            f"--steps {steps} is out of range for {model}: accepted 1..{train_steps}",
        )
    if name == "ddpm":
        return DDPMKernel(DDPMScheduler.from_config(scheduler_config), steps)
    if name == "euler-ancestral":
        return EulerAncestralKernel(EulerAncestralDiscreteScheduler.from_config(scheduler_config), steps)
    return DDIMKernel(DDIMScheduler.from_config(scheduler_config), steps, eta)


# what a draft network shares with its target's noise process (the training schedule and output)
TRAINED_SCHEDULE = (
    "num_train_timesteps",
    "beta_schedule",
    "beta_start",
    "beta_end",
    "trained_betas",
    "prediction_type",
)


def schedule_mismatch(target: dict, draft: dict, keys=TRAINED_SCHEDULE) -> str | None:
    """The first scheduler setting in `keys` where two scheduler configs differ (absent keys read as
    DDPMScheduler's defaults), or None."""
    target, draft = (DDPMScheduler.from_config(c).config for c in (target, draft))
    for key in keys:
        if target.get(key) != draft.get(key):
            return f"its scheduler's {key} is {draft.get(key)!r}, the target's {target.get(key)!r}"
    return None


class DiffusersTarget(Target):
    """A UNet2DModel and its scheduler config; runs the ddpm, ddim or euler-ancestral kernel at any step count."""

    kernels = VP_KERNELS
    family = "pixel-space UNet2DModel pipeline"
    takes_draft_networks = True

    def __init__(self, name: str, unet: UNet2DModel, scheduler_config: dict):
        self.name, self.unet, self.scheduler_config = name, unet.eval().requires_grad_(False), scheduler_config
        cfg = unet.config
        size = cfg.sample_size if isinstance(cfg.sample_size, (tuple, list)) else (cfg.sample_size,) * 2
        self.shape = (cfg.in_channels, *size)
        self.num_classes = cfg.num_class_embeds
        self.defaults = {"kernel": default_vp_kernel(scheduler_config.get("_class_name")), "steps": 100}
        self._moved: dict = {}

    def kernel(self, name, steps, *, eta=1.0, churn=None, gamma=None, prediction=None):
        self.check_kernel(name)
        return vp_kernel(self.name, self.scheduler_config, name, steps, eta)

    def network(self, kernel, device=torch.device("cpu"), dtype=None):
        """fp32 on CPU; fp16 on CUDA unless dtype says otherwise."""
        return UNetNetwork(placed(self.unet, self._moved, device, dtype), kernel)

    def place(self, device, dtype=None):
        placed(self.unet, self._moved, device, dtype)

    def draft_mismatch(self, other):
        """A draft network needs the target's sample shape, classes and noise schedule."""
        if type(other) is not type(self):
            return f"it is not a {self.family}"
        if other.shape != self.shape:
            return f"its sample shape {other.shape} differs from the target's {self.shape}"
        if other.num_classes != self.num_classes:
            return f"it has {other.num_classes} classes, the target {self.num_classes}"
        return schedule_mismatch(self.scheduler_config, other.scheduler_config)


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~"))


# text-to-image pipeline classes (model_index.json's _class_name) and the module of their adapter
TEXT_TO_IMAGE = {"StableDiffusionPipeline": "latent", "StableDiffusion3Pipeline": "flow_transformer"}
ACCEPTED = "a UNet2DModel pipeline (DDPM, DDIM), " + ", ".join(TEXT_TO_IMAGE)


def load_diffusers_target(spec: str, hub_only: bool = False, max_download_bytes: int | None = None) -> Target:
    """Load a diffusers model from an embedded name, a folder or a Hub id: a UNet2DModel and its
    scheduler config, or a text-to-image pipeline (TEXT_TO_IMAGE), told apart by model_index.json.

    safetensors only (use_safetensors=True: pickle weights are never loaded), no remote code.
    A pipeline folder (model_index.json, unet/, scheduler/), a bare model folder (config.json
    and scheduler_config.json side by side) and a pipeline whose UNet and scheduler sit at the root
    next to its model_index.json (google/ddpm-cifar10-32) are all accepted, as diffusers' pipelines
    load them. max_download_bytes: a Hub repo whose weights the loader would download (download_bytes)
    add up to more is refused before any weights are downloaded.
    """
    if hub_only and spec not in EMBEDDED:  # never the local disk: a Hub id, or refused just below
        source, local = Path(spec), False
    else:
        source = Path(EMBEDDED.get(spec, Path(spec).expanduser()))
        local = source.is_dir()
    if not local and not _looks_like_hub_id(spec):
        raise SpecdemoError(
            f"unknown model {spec!r}: not a preset, a mixture .json file, a folder or a Hub id (org/name)"
        )
    where = str(source) if local else spec
    files = None if local else _hub_files(spec, max_download_bytes)  # None: the Hub does not answer
    cache_only = not local and files is None
    try:
        with warnings.catch_warnings():  # diffusers passes huggingface_hub a deprecated argument
            warnings.simplefilter("ignore")
            index = _local_model_index(source) if local else _hub_model_index(spec, cache_only)
            pipeline_class = index.get("_class_name")
            if pipeline_class in TEXT_TO_IMAGE:
                if importlib.util.find_spec("transformers") is None:
                    raise SpecdemoError(
                        f"model {spec!r} is a {pipeline_class}, whose text encoders need the "
                        "transformers package: pip install transformers"
                    )
                _check_download(spec, files, pipeline_components(index), max_download_bytes)
                adapter = importlib.import_module(f".{TEXT_TO_IMAGE[pipeline_class]}", __package__)
                return adapter.load(spec, where, index, cache_only)
            if index and index.get("unet", [None, None])[1] != "UNet2DModel":
                raise SpecdemoError(
                    f"model {spec!r} is a {pipeline_class or 'pipeline'} without a UNet2DModel, "
                    f"which specdemo does not run; accepted: {ACCEPTED}"
                )
            # a component's folder when there is one, else the root (as diffusers' load_sub_model)
            has = (lambda name: (source / name).is_file()) if local else (lambda name: _hub_has(spec, name, files))
            sub = "unet" if has("unet/config.json") else None
            _check_download(spec, files, [sub or ""], max_download_bytes)
            unet = UNet2DModel.from_pretrained(where, subfolder=sub, use_safetensors=True, local_files_only=cache_only)
            scheduler = DDPMScheduler.load_config(
                where,
                subfolder="scheduler" if has("scheduler/scheduler_config.json") else None,
                local_files_only=cache_only,
            )
    except SpecdemoError:
        raise
    except Exception as err:  # offline, unknown repo, missing or pickle-only weights, bad config
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if local:
            cause, hint = (
                "folder",
                (
                    "the folder needs model_index.json with unet/ and scheduler/ (or the components of "
                    f"{', '.join(TEXT_TO_IMAGE)}), or config.json, scheduler_config.json and "
                    "safetensors weights"
                ),
            )
        elif _offline():
            cause, hint = (
                "offline",
                (
                    f"the Hub is offline here (HF_HUB_OFFLINE) and it is not in the local cache; "
                    f"{HOW_TO_GET.format(spec=spec)}"
                ),
            )
        elif cache_only:
            cause, hint = (
                "unreachable",
                (f"the Hub does not answer from here and it is not in the local cache; {HOW_TO_GET.format(spec=spec)}"),
            )
        else:
            cause, hint = (
                "hub",
                (f"the Hub may be unreachable, or the repo lacks safetensors weights; {HOW_TO_GET.format(spec=spec)}"),
            )
        raise ModelLoadError(spec, cause, reason, f"cannot load model {spec!r} ({reason}); {hint}") from None
    return DiffusersTarget(spec, unet, dict(scheduler))


HUB_TIMEOUT = 5.0  # seconds for the one request that tells whether the Hub answers


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _hub_files(repo_id: str, max_download_bytes: int | None = None) -> dict[str, int] | None:
    """One short request before any download: the repo's files and their sizes (0 where the Hub did
    not say: sizes are asked for only with max_download_bytes) when the Hub answers for repo_id; None
    when it does not (offline: then only the local cache is read, at once, where the downloads would
    retry for about a minute); a repo the Hub does not have is refused here."""
    if _offline():
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(repo_id, timeout=HUB_TIMEOUT, files_metadata=max_download_bytes is not None)
    except HFValidationError:
        raise SpecdemoError(
            f"{repo_id[:80]!r} is not a valid Hub id (org/name: letters, digits, '-', '_', '.')"
        ) from None
    except GatedRepoError:
        raise SpecdemoError(
            f"model {repo_id!r} is gated on the Hub: accept its terms and log in, or pass a local folder"
        ) from None
    except RepositoryNotFoundError:
        raise SpecdemoError(f"no model {repo_id!r} on the Hub (or it is private); check the id") from None
    except Exception:  # no network, DNS, timeout, a proxy's error page: read the cache only
        return None
    return {f.rfilename: f.size or 0 for f in info.siblings or ()}


def _hub_has(repo_id: str, filename: str, files: dict[str, int] | None) -> bool:
    """Whether a Hub repo has a file: from its listing, or (the Hub silent) from the local cache."""
    if files is not None:
        return filename in files
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename), str)


# the weights file names from_pretrained reads without a variant: diffusers' and transformers' single
# file or shards (an fp16, bf16 or non_ema variant names itself before .safetensors: not loaded)
WEIGHTS = re.compile(r"(diffusion_pytorch_model|model)(-\d+-of-\d+)?\.safetensors")


def skipped_components(index: dict) -> set[str]:
    """The components a text-to-image pipeline is loaded without (latent.load_pipeline): the entries
    model_index.json leaves null, and a safety checker with its feature extractor."""
    skipped = {name for name, entry in index.items() if isinstance(entry, list) and entry and entry[0] is None}
    return skipped | {"safety_checker", "feature_extractor"} if "safety_checker" in index else skipped


def pipeline_components(index: dict) -> list[str]:
    """The folders of a text-to-image pipeline's components that latent.load_pipeline loads."""
    skipped = skipped_components(index)
    return [name for name, entry in index.items() if isinstance(entry, list) and entry and name not in skipped]


def download_bytes(files: dict[str, int], folders) -> int:
    """The bytes of safetensors weights the loader downloads from a repo's files (name -> size): the
    non-variant weights directly in `folders` ("" the root), not fp16 or other variants, pickle
    weights, single-file checkpoints or components the loader skips."""
    folders = set(folders)
    total = 0
    for name, size in files.items():
        folder, _, base = name.rpartition("/")
        if folder in folders and WEIGHTS.fullmatch(base):
            total += size
    return total


def _check_download(repo_id: str, files: dict[str, int] | None, folders, max_download_bytes: int | None) -> None:
    """Refuse a Hub repo whose weights to download are over max_download_bytes (before any weights)."""
    if files is None or max_download_bytes is None:
        return
    weights = download_bytes(files, folders)
    if weights > max_download_bytes:
        raise SpecdemoError(
            f"model {repo_id!r} has {weights / 1e9:.1f} GB of weights, over the {max_download_bytes / 1e9:.1f} "
            "GB this app downloads; pick a smaller model or run it from the command line"
        )


def _local_model_index(folder: Path) -> dict:
    """A folder's model_index.json ({} for a bare model folder)."""
    path = folder / "model_index.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _hub_model_index(repo_id: str, cache_only: bool) -> dict:
    """A Hub repo's model_index.json ({} when it has none: a bare model repo, or not in the cache)."""
    from huggingface_hub import hf_hub_download

    try:
        return json.loads(Path(hf_hub_download(repo_id, "model_index.json", local_files_only=cache_only)).read_text())
    except Exception:
        return {}
