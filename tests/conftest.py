import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# plans are not kept between tests (a build samples with the online plan, or pilots afresh with --pilot);
# the cache's own tests give a folder
os.environ.setdefault("SPECDEMO_CACHE", "off")
# a click's runs are timed once (the app times them again for up to 1 s: runner.timed_again, tested alone)
os.environ.setdefault("SPECDEMO_APP_TIMING_SECONDS", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


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
