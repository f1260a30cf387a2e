#!/usr/bin/env bash
# One lent-GPU call for the prefill work: SGLang staged (sglang_site.sh), 06's prefill cases against FlashInfer and
# SGLang's extend kernel, then the sweep of the given engine arms; everything packed into $OUT/result.tgz (a call
# returns at most 8 files). Run from the repository root:
#   OUT=/path ARMS=params/arms/engine-ab-dflash.yaml ONLY=flashinfer,fi_hybrid_plugin [AB=1] [CALL_S=590] \
#     [SWEEP_ARGS='--contexts 1024,16384,65536,131072 --repeats 3 --set prefill_repeats=3'] bash scripts/device/prefill_engine_job.sh
set -uo pipefail
OUT=${OUT:?set OUT}
CALL_S=${CALL_S:-590}
AB=${AB:-1}
t0=$(date +%s)
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws} PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
stage_sglang_site /tmp/site "$OUT/r/stage.log" stage || exit 9
if [ "$AB" = 1 ]; then
  OUT=$OUT/r/ab ARMS=triton,flashinfer_ragged,sglang_extend PREFIXES=${PREFIXES:-16384,65536,122880} \
    timeout "${AB_S:-170}" bash scripts/device/prefill_ab_job.sh | grep -E "prefill|passed|failed|error" | tail -20
fi
left=$(( CALL_S - ($(date +%s) - t0) - 25 ))
OUT=$OUT/r/sweep BUDGET=$left bash scripts/device/sweep_job.sh
tar czf "$OUT/result.tgz" -C "$OUT/r" . && rm -rf "$OUT/r"
echo "[job] done after $(( $(date +%s) - t0 )) s"
