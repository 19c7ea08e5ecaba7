"""Trains the embedded class-conditional digit DDPMs (target and draft) and saves them as diffusers pipelines.

    python -m specdemo.train --which target --out specdemo/models/embedded/digits
    python -m specdemo.train --which draft --out specdemo/models/embedded/digits-draft
    python -m specdemo.train --which draft --teacher specdemo/models/embedded/digits \
        --out specdemo/models/embedded/digits-draft-distilled

A network learns the DDPM noise-prediction loss: its output regresses on the noise that made x_t. With
--teacher it regresses on the teacher's output at the same (x_t, t) instead (distillation): a speculative
sampler's draft is only ever asked what the target would output, so it learns that, and its regression
target carries none of the variance of the noise given x_t, which a small network fitted to noisy
targets learns through.

Training runs on the CPU. The defaults reproduce the shipped models bit for bit (same torch version and CPU
type): the seed fixes the weights and the data stream, and --num-threads is pinned because CPU kernels' results
depend on the thread count.
"""

import argparse
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
from diffusers.optimization import get_cosine_schedule_with_warmup
from diffusers.training_utils import EMAModel

from specdemo.digits import NUM_CLASSES, load_digits_images

logger = logging.getLogger(__name__)

IMAGE_SIZE = 16

# Two resolution levels and no attention: at 16x16 this is all digits need, and it keeps CPU sampling fast.
# The draft has 1/16 of the target's parameters and a cheaper forward pass, cheaper by less at batch 1,
# where per-layer overhead dominates.
ARCHITECTURES = {
    "target": {"block_out_channels": (32, 64), "norm_num_groups": 32},
    "draft": {"block_out_channels": (8, 16), "norm_num_groups": 8},
}


def make_unet(which: str) -> UNet2DModel:
    """Returns a freshly initialised class-conditional UNet for `which` ("target" or "draft")."""
    return UNet2DModel(
        sample_size=IMAGE_SIZE,
        in_channels=1,
        out_channels=1,
        num_class_embeds=NUM_CLASSES,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        add_attention=False,
        **ARCHITECTURES[which],
    )


def make_scheduler() -> DDPMScheduler:
    """Returns the noise schedule shared by target and draft (diffusers' defaults: linear betas, eps-prediction)."""
    return DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear")


def random_batches(num_items: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Yields index batches forever, reshuffling each epoch and dropping its incomplete last batch."""
    while True:
        order = torch.randperm(num_items, generator=generator)
        yield from order[: num_items - num_items % batch_size].split(batch_size)


def train(
    which: str,
    out: Path,
    teacher: Path | None,
    seed: int,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    ema_max_decay: float,
    log_every: int,
    num_threads: int,
) -> None:
    """Trains the `which` UNet with the DDPM noise-prediction loss (or, given a teacher pipeline's folder, to
    output what the teacher's UNet outputs) and saves its EMA weights to `out`."""
    torch.set_num_threads(num_threads)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    # One generator drives the batches, noise and timesteps; torch.manual_seed covers the initial weights.
    generator = torch.Generator().manual_seed(seed)

    images, labels = load_digits_images(IMAGE_SIZE)
    unet = make_unet(which)
    teacher_unet = None if teacher is None else UNet2DModel.from_pretrained(teacher / "unet").eval()
    scheduler = make_scheduler()
    logger.info("%s UNet: %d parameters", which, sum(p.numel() for p in unet.parameters()))

    optimizer = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=1e-6)
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, warmup_steps, steps)
    # Warmup power 3/4 as in diffusers' train_unconditional example: the EMA tracks the fast-moving
    # early weights closely and only approaches `ema_max_decay` late in training.
    ema = EMAModel(unet.parameters(), decay=ema_max_decay, use_ema_warmup=True, power=3 / 4)

    unet.train()
    batches = random_batches(len(images), batch_size, generator)
    running_loss, start = 0.0, time.perf_counter()
    for step in range(1, steps + 1):
        index = next(batches)
        clean = images[index]
        noise = torch.randn(clean.shape, generator=generator)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (len(index),), generator=generator)
        noisy = scheduler.add_noise(clean, noise, timesteps)
        if teacher_unet is None:
            wanted = noise
        else:
            with torch.no_grad():
                wanted = teacher_unet(noisy, timesteps, class_labels=labels[index]).sample

        loss = F.mse_loss(unet(noisy, timesteps, class_labels=labels[index]).sample, wanted)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        ema.step(unet.parameters())

        running_loss += loss.item()
        if step % log_every == 0 or step == steps:
            logger.info(
                "step %d/%d  loss %.4f  lr %.2e  ema decay %.4f  %.0fs",
                step,
                steps,
                running_loss / (step % log_every or log_every),
                lr_scheduler.get_last_lr()[0],
                ema.cur_decay_value,
                time.perf_counter() - start,
            )
            running_loss = 0.0

    ema.copy_to(unet.parameters())
    DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(out, safe_serialization=True)
    logger.info("saved the EMA weights to %s", out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m specdemo.train",
        description="Train a class-conditional DDPM on sklearn's digits (16x16) and save it as a diffusers pipeline.",
    )
    parser.add_argument("--which", choices=sorted(ARCHITECTURES), required=True, help="which UNet architecture")
    parser.add_argument("--out", type=Path, required=True, help="output folder for the DDPMPipeline")
    parser.add_argument(
        "--teacher",
        type=Path,
        default=None,
        help="a diffusers pipeline folder whose UNet's outputs the network learns (distillation) "
        "(default: none; the network learns the noise that made x_t)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights, batches, noise and timesteps (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=8000, help="number of optimizer steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per step (default: %(default)s)")
    parser.add_argument(
        "--lr", type=float, default=1e-3, help="peak AdamW learning rate, cosine-decayed to 0 (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=500, help="steps of linear learning-rate warmup (default: %(default)s)"
    )
    parser.add_argument(
        "--ema-max-decay", type=float, default=0.9999, help="upper bound of the EMA decay (default: %(default)s)"
    )
    parser.add_argument(
        "--log-every", type=int, default=250, help="log the mean loss every this many steps (default: %(default)s)"
    )
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="CPU threads for torch; the result depends on it bitwise. One thread also keeps two trainings "
        "running side by side on two cores efficient (default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    train(**vars(parse_args(argv)))


if __name__ == "__main__":
    main()
