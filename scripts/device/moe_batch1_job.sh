#!/usr/bin/env bash
# 11's reference run on one GPU in one call: SGLang 0.5.17 staged (scripts/device/sglang_site.sh), a seeded random-weight
# MoE model at Kimi K2.6's expert geometry (data/models/make_moe_model.py: 384 experts, top-8, one shared, expert
# width 64, LAYERS layers, in /dev/shm when it has room), then scripts/moe_batch1.py: one server per T in TOKENS, one
# after another, each with the expert distribution recorder (per_pass) and --enable-return-routed-experts. Run from the
# repository root:
#
#   OUT=/path [TOKENS=1,2,4,8,16] [LAYERS=31] [CONTEXTS=1024,16384] [REPEATS=2] [BUDGET=500] \
#     bash scripts/device/moe_batch1_job.sh
#
# The run folder is written to /tmp/moe-run (its recorder dumps are files of it) and packed at the end into
# $OUT/moe-batch1.tar.gz; $OUT also receives moe-logs.tar.gz (servers' logs), job.log and env.txt. Two calls (e.g.
# TOKENS=1,2,4 then TOKENS=8,16) give two tarballs: unpack both into one folder (their rows are appended JSONL; the
# second run.json's moe_servers lists only its servers: keep both, scripts/moe_batch1.py's run.json fields say how).
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
TOKENS=${TOKENS:-1,2,4,8,16}
LAYERS=${LAYERS:-31}
CONTEXTS=${CONTEXTS:-1024,16384}
REPEATS=${REPEATS:-2}
BUDGET=${BUDGET:-500}
SITE=${SITE:-/tmp/site}
RUN=${RUN:-/tmp/moe-run}
WORK=${WORK:-/tmp/moe-work}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
log=$OUT/job.log
mkdir -p "$OUT" "$WORK"
pack() {
  tar -czf "$OUT/moe-batch1.tar.gz" -C "$(dirname "$RUN")" "$(basename "$RUN")" 2>> "$log"
  for f in "$WORK"/server-*.log; do [ -f "$f" ] && tail -c 2000000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
  tar -czf "$OUT/moe-logs.tar.gz" -C "$WORK" --exclude='edr-*' . 2>> "$log"
}
trap pack EXIT
stage_sglang_site "$SITE" "$log" moe || exit $?
write_sglang_env "$SITE" "$OUT/env.txt"
df -h /dev/shm /tmp 2>&1 | tail -2 | tee -a "$OUT/env.txt"
shm=$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
MODEL=${MODEL:-$([ "${shm:-0}" -ge $(( LAYERS * 11 / 10 + 8 )) ] && echo /dev/shm/moe$LAYERS || echo /tmp/moe$LAYERS)}
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
  PYTHONPATH=$SITE python3 data/models/make_moe_model.py --out "$MODEL" --layers "$LAYERS" --device cuda --check \
    2>&1 | tail -3 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 3 ] && echo "[moe] the first-order check says routing does not spread; 11's check decides" | tee -a "$log"
fi
[ -f "$MODEL/model.safetensors.index.json" ] || { echo "[moe] model failed" | tee -a "$log"; exit 5; }
echo "[moe] model $MODEL after $(( $(date +%s) - t0 )) s: $(du -sh "$MODEL" | cut -f1)" | tee -a "$log"
left=$(( BUDGET - ($(date +%s) - t0) ))
PYTHONPATH=$SITE:$PWD/lib timeout $(( left + 40 )) python3 scripts/moe_batch1.py --out "$RUN" --work "$WORK" \
  --model-path "$MODEL" --site "$SITE" --tokens "$TOKENS" --contexts "$CONTEXTS" --repeats "$REPEATS" \
  --budget-s "$left" 2>&1 | tee -a "$log" | grep -E "ready|FAILED|recorder dump|ms per verify|routed|done|not started"
echo "[moe] driver exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$log"
tail -3 "$log"
