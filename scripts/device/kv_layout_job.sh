#!/usr/bin/env bash
# 10's reference run on one GPU in one call: SGLang 0.5.17 staged (scripts/device/sglang_site.sh), the plugin installed
# (its layout recorder serves every arm), a random-weight model with the investigation's per-GPU attention in LAYERS
# layers (data/models/make_mla_model.py; few layers keep a 128k Triton prefill short), then scripts/kv_layout.py: the
# arms' servers one after another (each sizes its own pool), each with a long request on a flushed and on a fragmented
# pool. Run from the repository root:
#
#   OUT=/path [ARMS=triton,plugin] [LAYERS=4] [CONTEXTS=32768,131072] [POOL=200000] [REPEATS=1] [BUDGET=520] \
#     [FILLER_CYCLES=1.1] [FILLER_CONCURRENCY=8] [STATES=fresh,fragmented] bash scripts/device/kv_layout_job.sh
#
# A dry run of the whole flow on a CPU: ENGINE=embedded (embedded servers as arms, their own slot pools; no SGLang,
# plugin or model), e.g. OUT=/tmp/o ENGINE=embedded ARMS=a CONTEXTS=1024 POOL=3072 bash scripts/device/kv_layout_job.sh
#
# $OUT receives the run folder kv-layout/ (run.json and kv_layout.jsonl, written row by row), kv-layout-logs.tar.gz
# (the servers' logs and the plugin's stats files, packed at the end), job.log and env.txt: 5 files.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
ARMS=${ARMS:-triton,plugin}
LAYERS=${LAYERS:-4}
CONTEXTS=${CONTEXTS:-32768,131072}
POOL=${POOL:-200000}
REPEATS=${REPEATS:-1}
BUDGET=${BUDGET:-520}
FILLER_CYCLES=${FILLER_CYCLES:-1.1}
STATES=${STATES:-fresh,fragmented}
FILLER_CONCURRENCY=${FILLER_CONCURRENCY:-8}
SITE=${SITE:-/tmp/site}
ENGINE=${ENGINE:-sglang}
WORK=${WORK:-/tmp/kvl-work}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
log=$OUT/job.log
mkdir -p "$OUT" "$WORK"
if [ "$ENGINE" = embedded ]; then
  ${PYTHON:-python3} scripts/kv_layout.py --engine embedded --out "$OUT/kv-layout" --work "$WORK" --arms "$ARMS" \
    --contexts "$CONTEXTS" --repeats "$REPEATS" --max-total-tokens "$POOL" --max-new-tokens 24 \
    --filler-concurrency 1 --filler-cycles "$FILLER_CYCLES" --states "$STATES" --budget-s "$BUDGET" 2>&1 | tee -a "$log" | grep -E "ready|FAILED|done"
  tar -czf "$OUT/kv-layout-logs.tar.gz" -C "$WORK" . 2>> "$log"
  exit 0
fi
stage_sglang_site "$SITE" "$log" kv-layout || exit $?
install_plugin /tmp/plugin "$log" kv-layout
write_sglang_env "$SITE" "$OUT/env.txt"
[ -f /tmp/mla$LAYERS/config.json ] || python3 data/models/make_mla_model.py --out /tmp/mla$LAYERS --layers "$LAYERS" \
  --seed 0 >> "$log" 2>&1 || { echo "[kv-layout] model failed" | tee -a "$log"; exit 5; }
echo "[kv-layout] model /tmp/mla$LAYERS after $(( $(date +%s) - t0 )) s" | tee -a "$log"
left=$(( BUDGET - ($(date +%s) - t0) ))
PYTHONPATH=$SITE:$PWD/lib timeout $(( left + 40 )) python3 scripts/kv_layout.py --out "$OUT/kv-layout" --work "$WORK" \
  --model-path /tmp/mla$LAYERS --site "$SITE" --plugin-path /tmp/plugin --arms "$ARMS" --contexts "$CONTEXTS" \
  --repeats "$REPEATS" --max-total-tokens "$POOL" --filler-cycles "$FILLER_CYCLES" --filler-concurrency "$FILLER_CONCURRENCY" --states "$STATES" --budget-s "$left" 2>&1 | tee -a "$log" \
  | grep -E "ready|FAILED|fresh|fragmented|filler|done|not started"
echo "[kv-layout] driver exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$log"
for f in "$WORK"/server-*.log; do [ -f "$f" ] && tail -c 2000000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
tar -czf "$OUT/kv-layout-logs.tar.gz" -C "$WORK" . 2>> "$log"
tail -3 "$log"
