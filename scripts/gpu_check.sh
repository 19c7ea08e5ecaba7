#!/usr/bin/env bash
# On a CUDA machine, in one go (within 10 minutes on an H100 or H200): the GPU tests (pytest -m gpu), then
# the sections of docs/benchmarks.md: "gpu" (a 1-row call of each UNet eager, as CUDA graphs and compiled;
# fp16 digits and a CIFAR-10-sized UNet at batch 1 and 16: plain, chain, block-verified chain, tree, auto,
# with ms per call and the share of time outside the target call), "sd_unet" (a Stable-Diffusion-sized UNet
# at batch 1, 50 steps) and "launches" (operations per round outside the network, before and now).
# Needs the packages of requirements.txt (gradio and plotly excepted) and the checkout (benchmarks/ is not
# installed with the package). With $OUT set (the device tool's output folder) the logs, a fresh report
# holding these sections and their results (bench_results/gpu.json, sd_unet.json, launches.json) go there; else the section is written
# into docs/benchmarks.md, its results into docs/bench_results/ and the README's table written again.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
status=0
python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=$?
# in place, or (under the device tool) a fresh report whose section and results the caller merges, then
# renders the README's table from the results (python -m benchmarks.run --readme)
report=docs/benchmarks.md
[ "$out" = . ] || report="$out/benchmarks_gpu.md"
python3 -m benchmarks.run --sections gpu,sd_unet,launches --out "$report" 2>&1 | tee "$out/gpu_bench.log"
exit $status
