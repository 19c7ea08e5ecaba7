#!/usr/bin/env bash
# On a CUDA machine, in one go: the GPU tests (pytest -m gpu), then the GPU section of
# docs/benchmarks.md (fp16 digits and a CIFAR-10-sized UNet at batch 1 and 16: plain, chain, block-verified
# chain, tree, auto).
# Needs the packages of requirements.txt (gradio and plotly excepted). With $OUT set (the device tool's
# output folder) the logs and a fresh report holding the GPU section go there; else the section is
# written into docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
status=0
python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=$?
# in place, or (under the device tool) a fresh report whose section the caller merges
report=docs/benchmarks.md
[ "$out" = . ] || report="$out/benchmarks_gpu.md"
python3 -m specdemo bench --sections gpu --out "$report" 2>&1 | tee "$out/gpu_bench.log"
exit $status
