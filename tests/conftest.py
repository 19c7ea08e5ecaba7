import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# plans are not kept between tests (a build samples with the online plan, or pilots afresh with --pilot);
# the cache's own tests give a folder
os.environ.setdefault("SPECDEMO_CACHE", "off")
# a click's runs are timed once (the app times them again for up to 1 s: runner.timed_again, tested alone)
os.environ.setdefault("SPECDEMO_APP_TIMING_SECONDS", "0")

import pytest
import torch

# pytest -n N (pytest-xdist, as CI runs): the workers share the cores, so a worker's torch threads (and those
# of the processes its tests start) are at most cores // N. Measured on 2 cores with a second 2-thread torch
# process beside it: the app's default click took over 120 s instead of 2.4 s (see one_thread below).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _threads = max(1, _cores // _workers)
    torch.set_num_threads(min(torch.get_num_threads(), _threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))


class FastUniforms:
    """The verifiers' random source for tests that check a verifier alone: one seeded generator
    serves every row (the sampler gives each trajectory its own)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def uniform(self, rows, count):
        return torch.rand((len(rows), count), generator=self.generator, dtype=torch.float64)


@pytest.fixture
def fast_uniforms():
    return FastUniforms


@pytest.fixture(scope="module")
def one_thread():
    """The tiny text-to-image models' operations are too small to split: on a busy 2-core machine two
    threads made a UNet call 25 times slower than one (0.78 s against 0.03 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    # `-m EXPR` on the command line replaces pytest.ini's `-m "not gpu"`: keep the CUDA tests out unless
    # the expression names them (pytest -m gpu, scripts/gpu_check.sh)
    if "gpu" not in (config.option.markexpr or ""):
        gpu = [item for item in items if item.get_closest_marker("gpu")]
        if gpu:
            config.hook.pytest_deselected(items=gpu)
            items[:] = [item for item in items if not item.get_closest_marker("gpu")]
