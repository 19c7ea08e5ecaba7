"""The embedded models' training script (specdemo/train.py): with --teacher the network learns the teacher's output."""

import logging
import re

import pytest
import torch
import torch.nn.functional as F
from diffusers import DDPMPipeline

from specdemo.digits import load_digits_images
from specdemo.train import IMAGE_SIZE, make_scheduler, make_unet, random_batches, train

BATCH = 8


@pytest.fixture
def restores_torch_settings():
    """train() pins the thread count, deterministic algorithms and the global seed for the whole process: put them back."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    deterministic, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def first_step_loss(teacher) -> float:
    """The first training step's loss computed here, independently of train(): the batch, noise and timesteps
    its seed-0 generator draws first, the student's seed-0 initial weights, the teacher's output as the target."""
    generator = torch.Generator().manual_seed(0)
    images, labels = load_digits_images(IMAGE_SIZE)
    index = next(random_batches(len(images), BATCH, generator))
    noise = torch.randn(images[index].shape, generator=generator)
    t = torch.randint(0, 1000, (BATCH,), generator=generator)
    noisy = make_scheduler().add_noise(images[index], noise, t)
    torch.manual_seed(0)
    student = make_unet("draft")
    with torch.no_grad():
        return float(
            F.mse_loss(
                student(noisy, t, class_labels=labels[index]).sample,
                teacher(noisy, t, class_labels=labels[index]).sample,
            )
        )


def test_with_a_teacher_the_network_regresses_on_the_teachers_output(tmp_path, caplog, restores_torch_settings):
    """A teacher of other weights (seed 1): the logged first loss is the mean squared difference between the
    student's output and the teacher's, not the DDPM loss against the noise (about 1)."""
    torch.manual_seed(1)
    teacher = make_unet("draft").eval()
    DDPMPipeline(unet=teacher, scheduler=make_scheduler()).save_pretrained(tmp_path / "teacher")
    caplog.set_level(logging.INFO, logger="specdemo.train")
    for folder in (None, tmp_path / "teacher"):
        train(
            "draft",
            tmp_path / "out",
            folder,
            seed=0,
            steps=1,
            batch_size=BATCH,
            lr=1e-3,
            warmup_steps=1,
            ema_max_decay=0.9999,
            log_every=1,
            num_threads=1,
        )
    on_noise, on_teacher = (float(v) for v in re.findall(r"step 1/1  loss (\S+)", caplog.text))
    expected = first_step_loss(teacher)
    assert on_noise > 0.5 and abs(expected - on_noise) > 0.1
    assert on_teacher == pytest.approx(expected, abs=6e-5)  # logged with 4 decimals
