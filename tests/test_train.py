"""The embedded models' training script (specdemo/train.py): with --teacher the network learns the teacher's output."""

import logging
import re

import pytest
import torch
from diffusers import DDPMPipeline

from specdemo.train import make_scheduler, make_unet, train


@pytest.fixture
def restores_torch_settings():
    """train() pins the thread count and deterministic algorithms for the whole process: put them back."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def test_with_a_teacher_the_network_regresses_on_the_teachers_output(tmp_path, caplog, restores_torch_settings):
    """The teacher is the student's own initial weights (the same seed): regressing on its output the first
    step's loss is exactly 0, where regressing on the noise it is about 1."""
    torch.manual_seed(0)
    DDPMPipeline(unet=make_unet("draft"), scheduler=make_scheduler()).save_pretrained(tmp_path / "teacher")
    caplog.set_level(logging.INFO, logger="specdemo.train")
    for teacher in (None, tmp_path / "teacher"):
        train("draft", tmp_path / "out", teacher, seed=0, steps=1, batch_size=8, lr=1e-3, warmup_steps=1,
              ema_max_decay=0.9999, log_every=1, num_threads=1)
    losses = [float(v) for v in re.findall(r"step 1/1  loss (\S+)", caplog.text)]
    assert len(losses) == 2 and losses[0] > 0.5 and losses[1] == 0.0
