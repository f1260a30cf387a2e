#!/usr/bin/env bash
# Plugin calls of 2026-11-30 (scripts/sglang_plugin_diag.py): PHASE=tp1 (four TP 1 servers on two GPUs:
# identity with logprob margins, the step sweep, torch-profiler traces) or PHASE=tp2 (stock, plugin and check at
# TP 2). Run from the repository root on nvidia-h200-x2, SGLang staged as in scripts/device/sglang_plugin_job.sh
# (/tmp/site, or /tmp/stage/part.00 + carried .rs2/part.*). Bounded by TOTAL seconds (default 530) in all.
# $OUT receives: diag-<phase>.tar.gz (run folders, identity.jsonl, profiles.jsonl, server logs, plugin stats,
# summary.txt, failures.json), traces-<phase>.tar.NN (SGLang's trace files, split: cat them), diag-<phase>.log, env-<phase>.txt,
# summary-<phase>.txt. SOURCE_CHECK=0 skips the NGRAM source check (importing SGLang's worker: up to 60 s).
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
PHASE=${PHASE:-tp1}
TOTAL=${TOTAL:-530}
SITE=${SITE:-/tmp/site}
PLUGIN=${PLUGIN_TARGET:-/tmp/plugin}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
work=/tmp/sglang-diag-$PHASE
rm -rf "$work"; mkdir -p "$work"
env_log="$OUT/env-$PHASE.txt"; : > "$env_log"
finish() {
  # SGLang's trace files, in pieces of at most 15 MiB (each file that comes back is limited to 16 MiB)
  (cd "$work" && find . -name "*.trace.json*" > /tmp/traces.list; tar -cf /tmp/traces-$PHASE.tar -T /tmp/traces.list) 2>>"$env_log"
  [ -s /tmp/traces.list ] && split -b 15M -d /tmp/traces-$PHASE.tar "$OUT/traces-$PHASE.tar."
  tar -C "$work" --exclude="*.trace.json*" -czf "$OUT/diag-$PHASE.tar.gz" . 2>>"$env_log"
  ls -la "$OUT" >> "$env_log"
  cat "$env_log"
  cat "$OUT/summary-$PHASE.txt" 2>/dev/null
}
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
stage_sglang_site "$SITE" "$env_log" diag || { rc=$?; finish; exit $rc; }
install_plugin "$PLUGIN" "$env_log" diag
export PYTHONPATH=$SITE:$PLUGIN:$PWD/lib
{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
  python3 -c "import sglang; print('sglang', sglang.__version__)" 2>&1 | tail -1
  [ "${SOURCE_CHECK:-1}" = 1 ] && timeout 60 python3 -c "
from sglang.srt.speculative.ngram_worker import NGRAMWorker as W
from specdiag_sglang_plugin import ngram_tail as t
print('ngram tail source check:', t.source_matches(W._prepare_draft_tokens), t.source_matches(W._update_ngram_corpus))" 2>&1 | tail -2
} >> "$env_log" 2>&1
timeout 60 python3 data/models/make_mla_model.py --out /tmp/mla-model --layers 2 --seed 0 2>&1 | tail -1 | tee -a "$env_log"
left=$(( TOTAL - ($(date +%s) - t0) - 20 ))
echo "[diag] driver $PHASE: budget ${left} s" | tee -a "$env_log"
# shellcheck disable=SC2086
timeout --signal=TERM --kill-after=10 $((left + 5)) python3 scripts/sglang_plugin_diag.py --phase "$PHASE" --out "$work" \
  --model-path /tmp/mla-model --site "$SITE" --plugin-path "$PLUGIN" --budget-s "$left" $EXTRA > "$OUT/diag-$PHASE.log" 2>&1
rc=$?
echo "[diag] driver exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$env_log"
cp "$work/summary.txt" "$OUT/summary-$PHASE.txt" 2>/dev/null || sed -n '/^=== summary/,$p' "$OUT/diag-$PHASE.log" > "$OUT/summary-$PHASE.txt"
finish
exit $rc
