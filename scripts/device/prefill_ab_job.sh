#!/usr/bin/env bash
# 06's prefill cases on a lent GPU (torch and triton from the machine; FlashInfer and SGLang's extend kernel where
# SGLang is staged in SITE), then the prefill kernel's GPU tests. Run from the repository root:
#   OUT=/path [ARMS=triton,flashinfer_ragged,sglang_extend] [CONFIGS=128:128:8:2,...] bash scripts/device/prefill_ab_job.sh
set -uo pipefail
OUT=${OUT:?set OUT}
SITE=${SITE:-/tmp/site}
ARMS=${ARMS:-triton}
CONFIGS=${CONFIGS:-}
PREFIXES=${PREFIXES:-16384,32768,65536,122880}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
pypath=$PWD/lib
[ -f "$SITE/sglang/version.py" ] && pypath=$SITE:$PWD/lib
PYTHONPATH=$pypath python3 -m specdiag.steps.kernel_ab.prefill --out "$OUT/prefill" --arms "$ARMS" \
  --configs "$CONFIGS" --prefixes "$PREFIXES" 2>&1 | tee "$OUT/prefill.log"
if python3 -c "import pytest" 2>/dev/null; then
  PYTHONPATH=$pypath python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prefill_gpu.py 2>&1 | tail -5 | tee -a "$OUT/prefill.log"
fi
