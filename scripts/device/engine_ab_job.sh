#!/usr/bin/env bash
# 09's engine A/B on one GPU in one call: SGLang 0.5.17 staged (scripts/device/sglang_site.sh), the plugin installed,
# a random-weight model with the investigation's per-GPU attention in LAYERS layers (data/models/make_mla_model.py;
# kept in /tmp for the next call on a warm machine), then scripts/engine_ab.py: the arms' servers started one after
# another, then measured one arm at a time. Run from the repository root:
#
#   OUT=/path [LAYERS=61] [BUDGET=540] [ARMS=flashinfer,triton] [CONTEXTS=1024,...,185000] \
#     [ARM_CONTEXTS='triton=1024:65536:131072'] bash scripts/device/engine_ab_job.sh
#   # the whole attention (64 heads) over 8 GPUs: HEADS=64 TP=8; an MoE at EP 8: EP=8 (with TP=8)
#   # DFLASH: a random drafter of DRAFTER_SHAPE (data/models/make_dflash_drafter.py) for the same model
#   OUT=/path ALGORITHM=DFLASH [DRAFTER_SHAPE=kimi-k2.6-tp8] [BLOCK=8] [WINDOW=2048] [SIM_ACC=4] \
#     ARMS=triton,triton_plugin bash scripts/device/engine_ab_job.sh
#
# SGLang comes from /tmp/site, or is joined from /tmp/stage/part.* (an earlier call) and .rs2/part.* (this call's
# carry) as sglang_site.sh says. $OUT receives engine-ab/ (run.json, engine_ab.jsonl and the servers' logs, written
# as they are measured: at most three arms per call, as 8 files come back), job.log and env.txt; a few arms per call
# on a warm machine, then `python scripts/engine_ab.py merge` joins the calls' folders into one run.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
LAYERS=${LAYERS:-61}
BUDGET=${BUDGET:-540}
CONTEXTS=${CONTEXTS:-1024,4096,16384,32768,65536,131072,185000}
ARM_CONTEXTS=${ARM_CONTEXTS:-}
ARMS=${ARMS:-flashinfer,triton}
FRACTIONS=${FRACTIONS:-0.2,0.25,0.33}
SITE=${SITE:-/tmp/site}
ALGORITHM=${ALGORITHM:-NGRAM}
DRAFTER_SHAPE=${DRAFTER_SHAPE:-kimi-k2.6-tp8}
BLOCK=${BLOCK:-8}
WINDOW=${WINDOW:-2048}
SIM_ACC=${SIM_ACC:-0}
REPEATS=${REPEATS:-5}
HEADS=${HEADS:-8}   # query heads of the model: 8 is one TP8 rank of Kimi K2.6's 64; 64 with TP=8 is the whole model
TP=${TP:-1}
EP=${EP:-1}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
log=$OUT/job.log
stage_sglang_site "$SITE" "$log" engine-ab || exit $?
install_plugin /tmp/plugin "$log" engine-ab
write_sglang_env "$SITE" "$OUT/env.txt"
[ -f "/tmp/mla$LAYERS/config.json" ] || python3 data/models/make_mla_model.py --out "/tmp/mla$LAYERS" --layers "$LAYERS" \
  --heads "$HEADS" --seed 0 >> "$log" 2>&1 || { echo "[engine-ab] model failed" | tee -a "$log"; exit 5; }
grep -q "\"num_attention_heads\": $HEADS," "/tmp/mla$LAYERS/config.json" \
  || { echo "[engine-ab] /tmp/mla$LAYERS has other heads than HEADS=$HEADS: remove it first" | tee -a "$log"; exit 5; }
echo "[engine-ab] model /tmp/mla$LAYERS after $(( $(date +%s) - t0 )) s: $(du -sh /tmp/mla$LAYERS | cut -f1)" | tee -a "$log"
spec=(--algorithm "$ALGORITHM" --tp-size "$TP" --ep-size "$EP")
if [ "$ALGORITHM" = DFLASH ]; then
  drafter=/tmp/dflash$LAYERS-$DRAFTER_SHAPE
  [ -f "$drafter/config.json" ] || python3 data/models/make_dflash_drafter.py --target "/tmp/mla$LAYERS" \
    --out "$drafter" --shape "$DRAFTER_SHAPE" --block-size "$BLOCK" | tee -a "$log" \
    || { echo "[engine-ab] drafter failed" | tee -a "$log"; exit 5; }
  spec+=(--draft-model-path "$drafter" --block-size "$BLOCK" --draft-window "$WINDOW" --simulate-acc-len "$SIM_ACC")
fi
left=$(( BUDGET - ($(date +%s) - t0) ))
run=$OUT/engine-ab   # rows land in $OUT as they are measured: a call cut short still returns them
rm -rf "$run"
PYTHONPATH=$SITE:$PWD/lib timeout $(( left + 30 )) python3 scripts/engine_ab.py --out "$run" --model-path /tmp/mla$LAYERS \
  --site "$SITE" --plugin-path /tmp/plugin --arms "$ARMS" --contexts "$CONTEXTS" --arm-contexts "$ARM_CONTEXTS" \
  --mem-fractions "$FRACTIONS" --max-total-tokens 260000 --repeats "$REPEATS" "${spec[@]}" --budget-s "$left" \
  2>&1 | tee -a "$log" \
  | grep -E "ready|FAILED|done|prefill|#0|not started|predicted" 
echo "[engine-ab] driver exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$log"
for f in "$run"/server-*.log; do [ -f "$f" ] && tail -c 300000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
rm -rf "$run"/stats-*   # the plugin's counts are in run.json (plugin_stats)
tail -5 "$log"
