"""Models a visitor may load on a public Space, and the cache that loads each once.

The Space's owner opens models with environment variables: SPECDEMO_APP_LOCAL_MODELS=1 for local
folders and files, SPECDEMO_APP_HUB_MODELS for Hub ids (comma-separated; "*" for any; unset: the
curated list, curated.py), and SPECDEMO_APP_MAX_DOWNLOAD_GB for the most weights a Hub model may bring.
A Hub model the server does not hold while the Hub is offline (HF_HUB_OFFLINE) is answered at once, in
one line that names it and says how to fetch it (hub_status), before the library tries to load it.

The library's model stack (diffusers' networks and schedulers) is imported by the first load, not
with this module: building the page needs none of it (app.py's import stays that of gradio and torch).
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from specdemo.config import EMBEDDED_NAMES, PRESET_NAMES
from specdemo.errors import ModelLoadError, SpecdemoError

from .curated import CURATED, curated

if TYPE_CHECKING:
    from specdemo import Target

MAX_DOWNLOAD_GB = 12.0  # a Hub model's weights the Space downloads at most (SPECDEMO_APP_MAX_DOWNLOAD_GB)
HUB_ID = re.compile(r"(?!.*\.json$)[A-Za-z0-9][\w.-]{0,95}/(?!\.\.?$)[\w.-]{1,96}")  # org/name, no "..", no .json

_cache: OrderedDict[tuple[str, bool], Target] = OrderedDict()
_cache_lock = threading.Lock()


def cached_target(spec: str, size: int = 4, hub_only: bool = False, max_download_bytes: int | None = None) -> Target:
    """resolve_target, remembering the last `size` models (each loaded once while it is kept: the
    app's check of a run's settings and the run itself share one load)."""
    key = (str(spec).strip(), hub_only)  # the same name read from the Hub only, or from the disk too
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    from specdemo import resolve_target

    target = resolve_target(key[0], hub_only=hub_only, max_download_bytes=max_download_bytes)
    import torch

    if torch.cuda.is_available():  # on the GPU where runs take it: ZeroGPU moves it into each worker it forks
        target.place("cuda")
    with _cache_lock:
        _cache[key] = target
        while len(_cache) > size:
            _cache.popitem(last=False)
    return target


def preload() -> None:
    """The embedded models loaded (and placed on the GPU where there is one) in the server's process at
    start-up, before any GPU task forks a worker from it, as ZeroGPU advises."""
    for name in EMBEDDED_NAMES:
        load_for_visitors(name)


def local_models() -> bool:
    return os.environ.get("SPECDEMO_APP_LOCAL_MODELS") == "1"


def max_download_bytes() -> int:
    """The most weights a visitor's Hub model may bring (the owner sets SPECDEMO_APP_MAX_DOWNLOAD_GB)."""
    text = os.environ.get("SPECDEMO_APP_MAX_DOWNLOAD_GB", str(MAX_DOWNLOAD_GB))
    try:
        return int(float(text) * 1e9)
    except ValueError:
        raise SpecdemoError(f"SPECDEMO_APP_MAX_DOWNLOAD_GB must be a number, got {text[:40]!r}") from None


def hub_list() -> list[str]:
    """The Hub ids visitors may load: SPECDEMO_APP_HUB_MODELS (comma-separated; "*" for any) where the
    owner sets it, else the curated list (its models and their drafts)."""
    text = os.environ.get("SPECDEMO_APP_HUB_MODELS")
    if text is None:
        return [c.repo for c in CURATED]
    return [s.strip() for s in text.split(",") if s.strip()]


def hub_allowed(spec: str) -> bool:
    listed = hub_list()
    return "*" in listed or spec in listed


def allowed_model(spec: str, what: str = "model") -> None:
    """Refuse a model the Space's owner has not opened to visitors: local folders and files unless
    SPECDEMO_APP_LOCAL_MODELS=1, Hub ids not on the list (hub_list: the curated models unless the owner
    sets SPECDEMO_APP_HUB_MODELS). A path is refused by its form alone, so the answer is the same
    whether it names a folder, a file or nothing: it says nothing about the server's disk."""
    if spec in PRESET_NAMES or spec in EMBEDDED_NAMES or spec == "frozen":
        return
    if HUB_ID.fullmatch(spec):
        listed = hub_list()
        # a draft is loaded by the library, which looks for a local folder of that name first
        local_name = what == "draft" and not local_models() and os.path.lexists(spec)
        if not hub_allowed(spec) or local_name:
            raise SpecdemoError(
                f"the Hub {what} {spec!r} is not on this Space's list"
                + (f"; accepted: {', '.join(listed)}" if listed else " (the list is empty)")
                + "; the Space's owner can add it to SPECDEMO_APP_HUB_MODELS"
            )
        return
    if not local_models():
        raise SpecdemoError(
            f"local {what}s are off on this Space; pick a listed model, or a Hub id (org/name) on the "
            "Space's list (its owner can turn local models on with SPECDEMO_APP_LOCAL_MODELS=1)"
        )


def hub_offline() -> bool:
    """Whether the Hub is off for this process (HF_HUB_OFFLINE), as huggingface_hub reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def hub_cached(spec: str) -> bool:
    """Whether the server's Hugging Face cache holds the model: a listed model's denoiser weights, or
    another id's model_index.json or config.json (no request is made)."""
    from huggingface_hub import try_to_load_from_cache

    entry = curated(spec)
    files = (entry.weights,) if entry else ("model_index.json", "config.json")
    try:
        return any(isinstance(try_to_load_from_cache(spec, f), str) for f in files)
    except Exception:  # an id huggingface_hub refuses: not in the cache
        return False


def hub_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def hub_status(spec: str) -> tuple[bool, str]:
    """Whether a Hub model can be loaded here without a refusal of the Space's own, and one line that
    says so: held in the server's cache; or not, and the Hub is offline (how to fetch it); gated and no
    token; over the download cap (a listed model's size, from the list); or downloaded when first run.
    No network request: the answer is immediate."""
    entry = curated(spec)
    size = f" ({entry.size})" if entry else ""
    if hub_cached(spec):
        return True, f"`{spec}` is in this server's cache{size}."
    if hub_offline():
        gated = " (gated: accept its licence on its Hub page and log in first)" if entry and entry.gated else ""
        return False, (
            f"{spec} is not on this server and the Hub is offline here (HF_HUB_OFFLINE): fetch it on the "
            f"server with `hf download {spec}`{size}{gated}, or run the app with internet, where it is "
            "downloaded when picked"
        )
    if entry and entry.gated and not hub_token():
        return False, (
            f"{spec} is gated on the Hub: the Space's owner accepts its licence on "
            f"huggingface.co/{spec} and sets HF_TOKEN (or runs `hf download {spec}` while logged in)"
        )
    if entry and entry.download_gb * 1e9 > max_download_bytes():
        return False, (
            f"{spec} downloads {entry.size} of weights, over the {max_download_bytes() / 1e9:.1f} GB this "
            f"Space downloads; its owner can raise SPECDEMO_APP_MAX_DOWNLOAD_GB or run `hf download {spec}` "
            "on the server"
        )
    return True, f"`{spec}` is downloaded from the Hub when first run{size}."


def check_hub_model(spec: str) -> None:
    """Refuse at once a Hub model the Space cannot load now (hub_status), before any request."""
    if HUB_ID.fullmatch(spec) and spec not in EMBEDDED_NAMES and not (local_models() and os.path.isdir(spec)):
        ok, line = hub_status(spec)
        if not ok:
            raise SpecdemoError(line)


def load_for_visitors(spec: str) -> Target:
    """A model as the Space loads what a visitor names (allowed_model has passed it): from the Hub only
    unless local models are on (a Hub id never reads the local disk), refused at once where hub_status
    says so, and cached. A repo of too many weights is refused before any download: a listed model by
    its size on the list (the library sums every safetensors file of a repo, variants and single-file
    checkpoints it never downloads included), any other by the library."""
    check_hub_model(spec)
    cap = None if curated(spec) else max_download_bytes()
    try:
        return cached_target(spec, hub_only=not local_models(), max_download_bytes=cap)
    except ModelLoadError as err:  # the loader's words name its internals and the command line's options
        raise SpecdemoError(LOAD_WORDS[err.cause].format(spec=err.spec[:120])) from None


LOAD_WORDS = {  # a model that could not be loaded (ModelLoadError.cause), in a visitor's words
    "folder": "{spec} is not a model this app runs: a diffusers folder with a UNet2DModel or a listed pipeline",
    "offline": "{spec} is not on this server and the Hub is offline here; pick an embedded or analytic model",
    "unreachable": "the Hub does not answer from this server, and {spec} is not in its cache; try again later",
    "hub": "{spec} could not be loaded from the Hub: the repo may not exist, may be private, or lacks "
    "safetensors weights",
}
