#!/usr/bin/env bash
# The GPU path in one go, under 5 minutes on one recent GPU:
#   1. bench_step.py at configs/gpu.yaml's size (12 blocks, width 512, context 512, batch 32),
#      eager: ms/step, tokens/s, peak memory and model FLOPs utilisation (MFU) of the derived
#      model, the supernet's weight step and a first-order search iteration;
#   2. the same with torch.compile (search.compile=true);
#   3. a short end-to-end search on CUDA with bf16 autocast, compile and fused AdamW
#      (evaluation and the alpha-Hessian monitor included).
#
# Usage:
#   bash benchmarks/gpu_check.sh           # on a CUDA machine
#   bash benchmarks/gpu_check.sh --dry     # on CPU at configs/tiny.yaml's size: checks that it runs
#                                          # (eager only: tests/test_gpu_path.py checks compiled = eager)
# Environment: PYTHON (default: .venv/bin/python if present, else python),
#   PEAK_TFLOPS (default 989: dense bf16 peak of an H100/H200 SXM; set it for other GPUs),
#   OUT (default runs/gpu-check): where the JSON results and the search run go.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
OUT=${OUT:-runs/gpu-check}
PEAK=${PEAK_TFLOPS:-989}
VARIANTS=derived,supernet_weight,search_order1

if [ "${1:-}" = "--dry" ]; then
  echo "gpu_check: dry mode (CPU, tiny size; the search without its race: this checks the script runs)"
  bench=(--config configs/tiny.yaml --set search.device=cpu --rounds 2 --warmup 1)
  search=(--config configs/tiny.yaml --set search.device=cpu --set race.enabled=false --set search.steps=4 --set search.warmup_steps=1 --set search.arch_warmup_steps=0 --set search.eval_every=4 --set search.compile=false)
elif [ -n "${1:-}" ]; then
  echo "usage: bash benchmarks/gpu_check.sh [--dry]" >&2; exit 2
else
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device; use --dry to check the script on CPU')"
  bench=(--config configs/gpu.yaml --set search.device=cuda --rounds 10 --warmup 3)
  search=(--config configs/gpu.yaml --set search.device=cuda --set search.steps=40 --set search.warmup_steps=4 --set search.arch_warmup_steps=8 --set search.eval_every=40 --set search.eval_windows=64)
fi
mkdir -p "$OUT"
"$PY" -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"

echo "== 1. eager =="
"$PY" benchmarks/bench_step.py "${bench[@]}" --set search.compile=false --variants "$VARIANTS" --peak-tflops "$PEAK" --json "$OUT/eager.json"
if [ "${1:-}" != "--dry" ]; then
  echo "== 2. torch.compile =="
  "$PY" benchmarks/bench_step.py "${bench[@]}" --set search.compile=true --variants "$VARIANTS" --peak-tflops "$PEAK" --json "$OUT/compiled.json"
fi
echo "== 3. end-to-end search (compile, autocast, fused AdamW) =="
"$PY" search.py --set search.compile=true "${search[@]}" --set logging.progress=false --out "$OUT/search" --overwrite
echo "gpu_check: done; results in $OUT"
