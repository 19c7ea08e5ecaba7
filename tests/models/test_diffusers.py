"""diffusers models: loading through the Hub code path from local folders, the adapter against the
scheduler's own step, exactness on a tiny UNet, and clear refusals."""

import json
import os
import subprocess
import sys
import types

import pytest
import torch
from diffusers import DDIMScheduler, DDPMPipeline, DDPMScheduler, UNet2DModel
from scipy import stats

from specdemo import SamplerConfig, build
from specdemo.errors import SpecdemoError
from specdemo.models import resolve_target

from ..helpers import tiny_unet


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-pipeline")
    DDPMPipeline(unet=tiny_unet(classes=3), scheduler=DDPMScheduler(clip_sample=True)).save_pretrained(
        folder, safe_serialization=True
    )
    return str(folder)


def test_pipeline_folder_loads_like_a_hub_model(pipeline_folder):
    target = resolve_target(pipeline_folder)
    assert target.shape == (1, 8, 8) and target.num_classes == 3
    assert set(os.listdir(pipeline_folder)) >= {"model_index.json", "unet", "scheduler"}
    result = build(
        SamplerConfig(
            model=pipeline_folder, steps=20, method="tree", tree="2,2", num_samples=3, class_label=2, device="cpu"
        )
    ).run()
    assert result.samples.shape == (3, 1, 8, 8) and torch.isfinite(result.samples).all()


def test_bare_model_folder_loads(tmp_path):
    tiny_unet().save_pretrained(tmp_path, safe_serialization=True)
    DDPMScheduler().save_config(tmp_path)
    assert resolve_target(str(tmp_path)).shape == (1, 8, 8)


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("kernel", ["ddpm", "ddim"])
def test_adapter_mean_and_scale_equal_the_scheduler_step(tmp_path, prediction, kernel):
    """The adapter's m_n and s_n against scheduler.step at the same timestep, noise removed."""
    DDPMPipeline(
        unet=tiny_unet(), scheduler=DDPMScheduler(prediction_type=prediction, clip_sample=True)
    ).save_pretrained(tmp_path, safe_serialization=True)
    problem = build(SamplerConfig(model=str(tmp_path), kernel=kernel, steps=25, eta=0.7, device="cpu"))
    k, net = problem.kernel, problem.network
    sched = (DDPMScheduler if kernel == "ddpm" else DDIMScheduler).from_pretrained(tmp_path, subfolder="scheduler")
    sched.set_timesteps(25)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1, 8, 8, generator=g)
    for n in (0, 7, 23):
        steps = torch.full((5,), n)
        out = net(x, steps)
        t = int(sched.timesteps[n])
        assert torch.allclose(out, problem.target.unet(x, t).sample, atol=1e-6)
        if kernel == "ddpm":  # step draws its noise from the generator: draw the same noise again
            noisy = sched.step(out, t, x, generator=torch.Generator().manual_seed(3)).prev_sample
            noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
            expected = noisy - (k.scales[n].float() * noise if t > 0 else 0)
        else:
            expected = sched.step(out, t, x, eta=0.7, variance_noise=torch.zeros_like(x)).prev_sample
            with_noise = sched.step(out, t, x, eta=0.7, variance_noise=torch.ones_like(x)).prev_sample
            assert float((with_noise - expected).mean()) == pytest.approx(float(k.scales[n]), rel=1e-4)
        assert torch.allclose(k.mean(out, x, steps), expected, atol=2e-5)


@pytest.mark.slow
@pytest.mark.statistical
def test_speculative_samples_of_a_tiny_unet_match_plain(tmp_path):
    """A low-dimensional summary (per-sample mean and two pixels) of 4,000 samples each."""
    DDPMPipeline(unet=tiny_unet(seed=3), scheduler=DDPMScheduler()).save_pretrained(tmp_path, safe_serialization=True)
    base = dict(model=str(tmp_path), steps=30, num_samples=4000, device="cpu")
    # seed 11: the reference of seed 1 sits at the edge of its own law (its per-sample means against
    # another plain sample of 8,000: p = 0.06), where a fixed-seed test of an exact sampler may fail
    plain = build(SamplerConfig(**base, method="target", seed=11)).run().samples.flatten(1)
    spec = build(SamplerConfig(**base, method="tree", tree="2,2", verifier="rank", draft_bias=1.0, seed=2)).run()
    tree = spec.samples.flatten(1)
    for column in (lambda s: s.mean(1), lambda s: s[:, 0], lambda s: s[:, 27]):
        assert stats.ks_2samp(column(plain).numpy(), column(tree).numpy()).pvalue > 1e-3 / 3
    assert spec.cost.speedup > 1.0


def test_independent_draft_network(pipeline_folder, tmp_path):
    DDPMPipeline(unet=tiny_unet(classes=3, seed=9), scheduler=DDPMScheduler(clip_sample=True)).save_pretrained(
        tmp_path, safe_serialization=True
    )
    result = build(
        SamplerConfig(
            model=pipeline_folder,
            draft=str(tmp_path),
            steps=20,
            method="chain",
            tree="1x3",
            num_samples=2,
            class_label=1,
            device="cpu",
        )
    ).run()
    assert result.cost.draft_calls > 0 and torch.isfinite(result.samples).all()


def test_a_draft_of_another_shape_is_refused(pipeline_folder, tmp_path):
    DDPMPipeline(unet=tiny_unet(channels=3), scheduler=DDPMScheduler()).save_pretrained(
        tmp_path, safe_serialization=True
    )
    with pytest.raises(SpecdemoError, match="cannot draft"):
        build(SamplerConfig(model=pipeline_folder, draft=str(tmp_path), method="chain", class_label=0, device="cpu"))


def test_pickle_weights_are_never_loaded(tmp_path):
    tiny_unet().save_pretrained(tmp_path, safe_serialization=False)  # diffusion_pytorch_model.bin only
    DDPMScheduler().save_config(tmp_path)
    with pytest.raises(SpecdemoError, match="cannot load model"):
        resolve_target(str(tmp_path))


def test_missing_weights_name_the_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(SpecdemoError, match=str(tmp_path)):
        resolve_target(str(tmp_path))


@pytest.mark.slow
def test_offline_hub_id_is_refused_fast_with_a_way_out():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "specdemo", "sample", "--model", "google/ddpm-cifar10-32"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "google/ddpm-cifar10-32" in done.stderr and "hf download" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("spec", ["not a model", "./no/such/folder", ""])
def test_unknown_models_are_refused(spec):
    with pytest.raises(SpecdemoError):
        resolve_target(spec)


def test_an_unreachable_hub_is_answered_from_the_cache_at_once(monkeypatch):
    """Without HF_HUB_OFFLINE and without a network, one short request finds the Hub silent; the
    loaders then read the local cache only (no minute of retried downloads) and say what to do."""
    import huggingface_hub

    from specdemo.models import diffusers_unet

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def silent(self, repo_id, timeout=None, **kwargs):
        calls.append(timeout)
        raise ConnectionError("no route to host")

    def from_pretrained(*args, **kwargs):
        calls.append(("unet", kwargs.get("local_files_only")))
        raise OSError("not in the cache")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", silent)
    monkeypatch.setattr(UNet2DModel, "from_pretrained", from_pretrained)
    with pytest.raises(SpecdemoError, match="does not answer from here and it is not in the local cache; download it"):
        diffusers_unet.load_diffusers_target("someone/some-unet")
    assert calls == [diffusers_unet.HUB_TIMEOUT, ("unet", True)]


def test_a_repo_the_hub_does_not_have_is_named(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from specdemo.models import diffusers_unet

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def missing(self, repo_id, timeout=None, **kwargs):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # as the Hub's 404 raises it
        Exception.__init__(error, "404 Repository Not Found")
        raise error

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", missing)
    with pytest.raises(SpecdemoError, match="no model 'someone/nothing' on the Hub"):
        diffusers_unet.load_diffusers_target("someone/nothing")


def test_a_hub_model_over_the_download_cap_is_refused_before_any_download(monkeypatch):
    import huggingface_hub

    from specdemo.models import diffusers_unet, resolve_target

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    asked, loaded = [], []

    def answers(self, repo_id, timeout=None, files_metadata=False, **kwargs):
        asked.append(files_metadata)
        weights = [
            ("unet/diffusion_pytorch_model-00001-of-00002.safetensors", 6e9),
            ("unet/diffusion_pytorch_model-00002-of-00002.safetensors", 5e9),
            ("unet/config.json", 1e3),
            ("unet/diffusion_pytorch_model.fp16.safetensors", 5.5e9),  # a variant not loaded: not counted
            ("unet/diffusion_pytorch_model.bin", 9e9),
        ]  # pickle weights are never loaded: not counted
        return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=n, size=int(s)) for n, s in weights])

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", answers)
    monkeypatch.setattr(diffusers_unet, "_hub_model_index", lambda repo_id, cache_only: dict(DDPM_INDEX))

    def from_pretrained(*args, **kwargs):
        loaded.append(args)
        raise OSError("no download in the tests")

    monkeypatch.setattr(UNet2DModel, "from_pretrained", from_pretrained)
    with pytest.raises(SpecdemoError, match=r"'big/model' has 11.0 GB of weights, over the 10.0 GB this app downloads"):
        resolve_target("big/model", hub_only=True, max_download_bytes=10 * 10**9)
    assert asked == [True] and not loaded
    with pytest.raises(SpecdemoError):  # under the cap the load goes on (and fails here at the download)
        diffusers_unet.load_diffusers_target("big/model", max_download_bytes=12 * 10**9)
    assert asked == [True, True] and loaded


DDPM_INDEX = {
    "_class_name": "DDPMPipeline",
    "_diffusers_version": "0.0.4",
    "scheduler": ["diffusers", "DDPMScheduler"],
    "unet": ["diffusers", "UNet2DModel"],
}


def root_layout_folder(folder):
    """google/ddpm-cifar10-32's layout: model_index.json, and the UNet (config.json + safetensors) and
    scheduler_config.json at the root, no unet/ or scheduler/ folder."""
    tiny_unet(seed=4).save_pretrained(folder, safe_serialization=True)
    DDPMScheduler(num_train_timesteps=500).save_config(folder)
    (folder / "model_index.json").write_text(json.dumps(DDPM_INDEX))
    return folder


def hub_cache_of(cache, repo_id, folder):
    """`folder` as the Hub cache holds a download of repo_id (refs/main -> snapshots/<commit>/...)."""
    import shutil

    commit = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("hub", ["silent", "answers"])
@pytest.mark.parametrize("layout", ["root", "unet folder"])
def test_a_hub_pipeline_with_its_unet_at_the_root_loads(tmp_path, monkeypatch, layout, hub):
    """A Hub id goes through the Hub's code path (here its cache): the UNet and scheduler load from
    unet/ and scheduler/ when the repo has them, else from the root next to model_index.json."""
    import huggingface_hub

    from specdemo.models import diffusers_unet

    if layout == "root":
        folder = root_layout_folder(tmp_path / "repo")
    else:
        DDPMPipeline(unet=tiny_unet(seed=4), scheduler=DDPMScheduler(num_train_timesteps=500)).save_pretrained(
            tmp_path / "repo", safe_serialization=True
        )
        folder = tmp_path / "repo"
    names = hub_cache_of(tmp_path / "cache", "google/ddpm-cifar10-32", folder)
    assert ("config.json" in names) == (layout == "root") and "model_index.json" in names
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    if hub == "answers":  # the Hub lists the repo's files; the downloads come from the cache
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(
            huggingface_hub.HfApi,
            "model_info",
            lambda self, repo_id, **kwargs: types.SimpleNamespace(
                sha="0" * 40, siblings=[types.SimpleNamespace(rfilename=n, size=1) for n in names]
            ),
        )
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = diffusers_unet.load_diffusers_target("google/ddpm-cifar10-32", max_download_bytes=10**9)
    assert isinstance(target, diffusers_unet.DiffusersTarget) and target.shape == (1, 8, 8)
    assert target.scheduler_config["num_train_timesteps"] == 500
    assert torch.equal(target.unet.conv_in.weight, tiny_unet(seed=4).conv_in.weight)


def test_a_root_layout_folder_loads(tmp_path):
    assert resolve_target(str(root_layout_folder(tmp_path))).shape == (1, 8, 8)


# stable-diffusion-v1-5/stable-diffusion-v1-5's safetensors (sizes rounded): 4.27 GB of fp32 components
SD15_INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "_diffusers_version": "0.6.0",
    "feature_extractor": ["transformers", "CLIPImageProcessor"],
    "safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"],
    "scheduler": ["diffusers", "PNDMScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}
SD15_LOADED = {
    "unet/diffusion_pytorch_model.safetensors": 3_438_167_536,
    "text_encoder/model.safetensors": 492_265_168,
    "vae/diffusion_pytorch_model.safetensors": 334_643_268,
}
SD15_FILES = {
    **SD15_LOADED,
    "unet/diffusion_pytorch_model.fp16.safetensors": 1_719_125_304,
    "unet/diffusion_pytorch_model.non_ema.safetensors": 3_438_167_536,
    "unet/diffusion_pytorch_model.bin": 3_438_354_725,
    "text_encoder/model.fp16.safetensors": 246_144_152,
    "vae/diffusion_pytorch_model.fp16.safetensors": 167_335_342,
    "safety_checker/model.safetensors": 1_215_981_830,
    "safety_checker/model.fp16.safetensors": 608_016_280,
    "v1-5-pruned.safetensors": 7_703_324_286,
    "v1-5-pruned-emaonly.safetensors": 4_265_096_720,
    "v1-5-pruned-emaonly.fp16.safetensors": 2_132_696_762,
    "model_index.json": 541,
    "unet/config.json": 743,
    "scheduler/scheduler_config.json": 308,
    "tokenizer/vocab.json": 1_059_962,
    "feature_extractor/preprocessor_config.json": 342,
}


def test_the_download_cap_counts_only_the_weights_the_loader_downloads():
    from specdemo.models import diffusers_unet

    components = diffusers_unet.pipeline_components(SD15_INDEX)
    assert sorted(components) == ["scheduler", "text_encoder", "tokenizer", "unet", "vae"]
    assert diffusers_unet.download_bytes(SD15_FILES, components) == sum(SD15_LOADED.values())  # 4.27 GB
    shards = {f"text_encoder_3/model-0000{i}-of-00002.safetensors": 4 * 10**9 for i in (1, 2)}
    assert (
        diffusers_unet.download_bytes(
            {**shards, "text_encoder_3/model.fp16-00001-of-00002.safetensors": 1}, ["text_encoder_3"]
        )
        == 8 * 10**9
    )  # sharded T5, no variant shard


def test_a_hub_pipeline_is_capped_by_its_loaded_components(monkeypatch):
    """SD 1.5 (over 30 GB of safetensors in the repo, 4.27 GB loaded) passes a 12 GB cap, not a 4 GB one."""
    import huggingface_hub
    from diffusers import StableDiffusionPipeline

    from specdemo.models import diffusers_unet

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    loaded = []

    def answers(self, repo_id, timeout=None, files_metadata=False, **kwargs):
        return types.SimpleNamespace(
            siblings=[types.SimpleNamespace(rfilename=n, size=s) for n, s in SD15_FILES.items()]
        )

    def from_pretrained(*args, **kwargs):
        loaded.append(kwargs)
        raise OSError("no download in the tests")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", answers)
    monkeypatch.setattr(diffusers_unet, "_hub_model_index", lambda repo_id, cache_only: dict(SD15_INDEX))
    monkeypatch.setattr(StableDiffusionPipeline, "from_pretrained", from_pretrained)
    with pytest.raises(SpecdemoError, match=r"has 4.3 GB of weights, over the 4.0 GB this app downloads"):
        resolve_target("sd/v1-5", hub_only=True, max_download_bytes=4 * 10**9)
    assert not loaded
    with pytest.raises(SpecdemoError, match="cannot load model 'sd/v1-5'"):  # under the cap: on to the download
        resolve_target("sd/v1-5", hub_only=True, max_download_bytes=12 * 10**9)
    assert loaded and loaded[0]["safety_checker"] is None
