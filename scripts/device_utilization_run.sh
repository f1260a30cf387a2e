#!/usr/bin/env bash
# Record notebook 02's measurement on the GPU device machine: the embedded server on CUDA, GPU 0
# sampled through NVML during one long request. Run from the repository root with $OUT set (the
# device tool's output folder); carry the wheels of fastapi/uvicorn and their needs in .whl/ (see
# docs/device-notes.md). Tunables: CONTEXT (prompt tokens), MAX_NEW (most tokens to decode),
# DECODE_S (seconds of decode to aim for), ALGO (STANDALONE, NGRAM, NONE); DEVICE, TELEMETRY and
# WHEELS for a dry run elsewhere (DEVICE=cpu TELEMETRY=cpu WHEELS=none).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder to write results to}
CONTEXT=${CONTEXT:-8192}
MAX_NEW=${MAX_NEW:-4096}
DECODE_S=${DECODE_S:-15}
ALGO=${ALGO:-STANDALONE}
DEVICE=${DEVICE:-cuda}
TELEMETRY=${TELEMETRY:-nvml}
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/lib
else
  export PYTHONPATH=$PWD/lib
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,clocks.sm,power.draw --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_telemetry_gpu.py -s 2>&1 | tail -5 > "$OUT/gpu-test.log"
timeout 330 python3 scripts/record_utilization.py --embedded --server-timeout-s 150 --device "$DEVICE" --algorithm "$ALGO" \
  --context-tokens "$CONTEXT" --max-new-tokens "$MAX_NEW" --decode-seconds "$DECODE_S" \
  --telemetry "$TELEMETRY" --gpu 0 --sample-hz 50 --idle-s 1.0 --out-dir "$OUT/run" 2>&1 | tee "$OUT/record.log"
status=${PIPESTATUS[0]}
cat "$OUT/gpu-test.log"
cat "$OUT/nvidia-smi.csv"
exit "$status"
