#!/usr/bin/env bash
# Any arms file on the lent GPU machine in one call: SGLang 0.5.17 staged (scripts/device/sglang_site.sh), the plugin
# installed, the model folders the arms file names made from its recipes (data/models/make_*.py; kept in /tmp for the
# next call on a warm machine), then `specdiag sweep` within the time budget. Run from the repository root:
#
#   OUT=/path ARMS=params/arms/engine-ab-ngram.yaml MEASURE=engine_ab [ONLY=flashinfer,triton] [BUDGET=540] \
#     [SWEEP_ARGS='--contexts 1024,65536 --repeats 3 --set slow_step_ms=200'] bash scripts/device/sweep_job.sh
#   OUT=/path ARMS=params/arms/kv-layout.yaml MEASURE=kv_layout ONLY=plugin,plugin_contiguous bash scripts/device/sweep_job.sh
#   OUT=/path ARMS=params/arms/moe-batch1.yaml MEASURE=moe_batch1 ONLY=t1,t2,t4 bash scripts/device/sweep_job.sh
#   OUT=/path ARMS=params/arms/plugin-identity.yaml MEASURE=plugin_identity bash scripts/device/sweep_job.sh
#   OUT=/path ARMS=params/arms/tiny-notebooks.yaml MEASURE=snapshot,commit_probe,baseline_sweep,drafter_timing \
#     bash scripts/device/sweep_job.sh   # 00-04's tables, each arm in sweep/<arm>/
#   # a dry run on a CPU: the embedded arms, no SGLang
#   OUT=/tmp/o ARMS=params/arms/embedded.yaml MEASURE=engine_ab ENGINE=embedded bash scripts/device/sweep_job.sh
#
# $OUT receives sweep/ (run.json and the rows, written as measured: a call cut short still returns them; the servers'
# logs trimmed; the plugin's stats kept in run.json, not as files), job.log and env.txt. Several calls' sweep/
# folders are joined by `specdiag merge --out RUN CALL1/sweep CALL2/sweep`.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
ARMS=${ARMS:?set ARMS to an arms file (params/arms/)}
MEASURE=${MEASURE:?set MEASURE to a measurement (engine_ab, kv_layout, ...) or several comma-separated}
ONLY=${ONLY:-}
BUDGET=${BUDGET:-540}
SWEEP_ARGS=${SWEEP_ARGS:-}
SITE=${SITE:-/tmp/site}
PLUGIN=${PLUGIN_PATH:-/tmp/plugin}
ENGINE=${ENGINE:-sglang}   # embedded: no SGLang staged, no plugin installed (the embedded arms; WHEELS: its web stack)
PYTHON=${PYTHON:-python3}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh
log=$OUT/job.log
mkdir -p "$OUT"
only=()
[ -n "$ONLY" ] && only=(--only "$ONLY")
if [ "$ENGINE" = embedded ]; then
  SITE= PLUGIN= pypath=$PWD/lib
  # the embedded server's web stack where the machine lacks it: wheels carried in $WHEELS (fastapi, uvicorn, ...)
  if compgen -G "${WHEELS:-.whl}/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-embedded \
      "${WHEELS:-.whl}"/*.whl 2>&1 | tail -2 | tee -a "$log"
    pypath=/tmp/site-embedded:$pypath
  fi
else
  stage_sglang_site "$SITE" "$log" sweep || exit $?
  install_plugin "$PLUGIN" "$log" sweep
  write_sglang_env "$SITE" "$OUT/env.txt"
  pypath=$SITE:$PWD/lib
fi
PYTHONPATH=$pypath "$PYTHON" -m specdiag.sweep models --arms "$ARMS" "${only[@]}" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[sweep] models failed" | tee -a "$log"; exit 5; }
echo "[sweep] models ready after $(( $(date +%s) - t0 )) s" | tee -a "$log"
left=$(( BUDGET - ($(date +%s) - t0) ))
run=$OUT/sweep
rm -rf "$run"
# shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
PYTHONPATH=$pypath timeout $(( left + 30 )) "$PYTHON" -m specdiag.sweep sweep --arms "$ARMS" --measure "$MEASURE" \
  --out "$run" "${only[@]}" --site "$SITE" --plugin-path "$PLUGIN" --budget-s "$left" $SWEEP_ARGS 2>&1 | tee -a "$log" \
  | grep -E "starting|ready|FAILED|done|not started|prefill|#0|fresh|fragmented|filler|ms per verify|routed|identity|differs"
rc=${PIPESTATUS[0]}
echo "[sweep] driver exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$log"
for f in "$run"/server-*.log; do [ -f "$f" ] && tail -c 2000000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
rm -rf "$run"/stats-*   # the plugin's stats are in run.json (plugin_stats, plugin_check); 10's layouts in its rows
rm -rf "$run"/edr-*     # 11's recorder dumps are copied into the run's files/
tail -3 "$log"
exit "$rc"
