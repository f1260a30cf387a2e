#!/usr/bin/env bash
# One device call: record a real SGLang 0.5.17 job on the H200 (scripts/record_sglang.py) and tar the
# results into $OUT. Run from the repository root:  bash scripts/device/sglang_job.sh tiny|mla
#
# SGLang comes from /tmp/site. If it is not there yet, it is joined from /tmp/stage/part.00 (staged by
# call 1) and .rs2/part.* (carried in this call), checked against .rs2/SHA256SUMS, and extracted
# (scripts/device/README.md). /tmp/site goes FIRST on PYTHONPATH (its transformers 5.12.1 hides the
# machine's 5.17). The whole call is bounded: $BUDGET s for the recording (default 500; the recorder is killed at BUDGET + 30), then tar.
# Dry run elsewhere: ENGINE=embedded EXTRA="--device cpu --contexts 256,512 ..." SITE=none.
#
# $OUT receives (at most 8 files): <job>.tar.gz (run-<job>-*/ run folders with server.log, raw-<job>-*/
# raw exchanges, failures-<job>.json), record-<job>.log (the recorder's log), summary-<job>.txt,
# env-<job>.txt (nvidia-smi, versions, the site check). The summary is printed last.
set -uo pipefail
JOB=${1:?usage: sglang_job.sh tiny|mla}
OUT=${OUT:?set OUT to the folder to write results to}
BUDGET=${BUDGET:-500}
ENGINE=${ENGINE:-sglang}
SITE=${SITE:-/tmp/site}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
work=/tmp/sglang-job-$JOB
rm -rf "$work"; mkdir -p "$work"
env_log="$OUT/env-$JOB.txt"
: > "$env_log"
t0=$(date +%s)

if [ "$SITE" != none ]; then
  # shellcheck source=scripts/device/sglang_site.sh
  . scripts/device/sglang_site.sh
  stage_sglang_site "$SITE" "$env_log" job || exit $?
  export PYTHONPATH=$SITE:$PWD/lib
else
  export PYTHONPATH=$PWD/lib
fi

{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
  python3 -c "import sglang, transformers; print('sglang', sglang.__version__, 'transformers', transformers.__version__, transformers.__file__)" 2>&1 | tail -1
} >> "$env_log" 2>&1

args=(--job "$JOB" --engine "$ENGINE" --out "$work" --budget-s "$BUDGET")
if [ "$JOB" = mla ]; then
  if [ "$ENGINE" = sglang ]; then
    timeout 60 python3 data/models/make_mla_model.py --out /tmp/mla-model --layers 2 --seed 0 2>&1 | tail -1 | tee -a "$env_log"
    args+=(--model-path /tmp/mla-model)
  fi
fi
# shellcheck disable=SC2206
args+=($EXTRA)
timeout --signal=TERM --kill-after=20 $((BUDGET + 30)) python3 scripts/record_sglang.py "${args[@]}" > "$OUT/record-$JOB.log" 2>&1
rc=$?
echo "[job] recorder exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$env_log"
sed -n '/^=== summary/,$p' "$OUT/record-$JOB.log" > "$OUT/summary-$JOB.txt"
tar -C "$work" -czf "$OUT/$JOB.tar.gz" . 2>>"$env_log"
echo "[job] $OUT/$JOB.tar.gz: $(du -h "$OUT/$JOB.tar.gz" | cut -f1)" | tee -a "$env_log"
grep -E "FAILED|DISAGREES|NO SPEC|FALLBACK" "$OUT/record-$JOB.log" | head -20
cat "$env_log"
cat "$OUT/summary-$JOB.txt"
exit $rc
