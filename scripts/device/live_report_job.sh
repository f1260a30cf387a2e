#!/usr/bin/env bash
# A live report on a GPU host in one command, the user's way: a server started by `specdiag.launchers serve` with the
# plugin asked for and no attention backend named (where FlashInfer is importable the launcher picks FlashInfer
# prefill with Triton decode and verify through the plugin, and says so), then `specdiag report run --server URL`
# against it, then the server stopped. Run from the repository root:
#
#   OUT=/path [PARAMS=params/quick.yaml] [NOTEBOOKS='00 01 02 03 04 05 06 07'] [MEM=0.2] bash scripts/device/live_report_job.sh
#   # a dry run on a CPU against the embedded server
#   OUT=/tmp/o ENGINE=embedded SERVE_ARGS='--engine embedded' PARAMS=params/smoke.yaml bash scripts/device/live_report_job.sh
#
# SGLang comes from SITE (staged by sglang_site.sh), the Jupyter stack from wheels in WHEELS (default .whl) installed
# into /tmp/jupyter-site where this Python lacks papermill. $OUT/result.tgz holds the run folder (live/), the server's
# log, env.txt and job.log.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
PARAMS=${PARAMS:-params/quick.yaml}
NOTEBOOKS=${NOTEBOOKS:-00 01 02 03 04 05 06 07}
ENGINE=${ENGINE:-sglang}
SITE=${SITE:-/tmp/site}
PLUGIN=${PLUGIN_PATH:-/tmp/plugin}
JUPYTER_SITE=${JUPYTER_SITE:-/tmp/jupyter-site}
PORT=${PORT:-30000}
READY_S=${READY_S:-420}
PYTHON=${PYTHON:-python3}
# the 61-layer twin and its DFLASH drafter as params/arms/engine-ab-dflash.yaml makes them, acceptance not forced
SERVE_ARGS=${SERVE_ARGS:---engine sglang --model /tmp/mla61 --draft-model /tmp/dflash61-kimi-k2.6-tp8 --algorithm DFLASH \
--block-size 8 --draft-window 2048 --context-length 200000 --max-total-tokens 260000 --mem-fraction-static ${MEM:-0.2}}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
r=$OUT/r
mkdir -p "$r"
log=$r/job.log
say() { echo "[live] $* (+$(( $(date +%s) - t0 )) s)" | tee -a "$log"; }
# shellcheck source=scripts/device/sglang_site.sh
. scripts/device/sglang_site.sh

pypath=$PWD/lib
if [ "$ENGINE" = sglang ]; then
  stage_sglang_site "$SITE" "$log" live || exit $?
  install_plugin "$PLUGIN" "$log" live
  write_sglang_env "$SITE" "$r/env.txt"
  pypath=$SITE:$PWD/lib
  PYTHONPATH=$pypath "$PYTHON" -m specdiag.sweep models --arms params/arms/engine-ab-dflash.yaml --only fi_hybrid_plugin \
    2>&1 | tee -a "$log"
fi
if ! PYTHONPATH=$pypath "$PYTHON" -c "import papermill, nbconvert, ipykernel" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$JUPYTER_SITE" "${WHEELS:-.whl}"/*.whl \
    2>&1 | tail -2 | tee -a "$log"
  pypath=$JUPYTER_SITE:$pypath
  PYTHONPATH=$pypath "$PYTHON" -c "import papermill, nbconvert, ipykernel; print('papermill', papermill.__version__)" \
    2>&1 | tee -a "$log"
fi

# the server, the user's way: the plugin on (what `make serve ENGINE=sglang PLUGIN=splitkv` exports), no backend named
say "starting: $SERVE_ARGS"
# shellcheck disable=SC2086  # SERVE_ARGS is a list of options
SGLANG_PLUGINS=specdiag_splitkv SPECDIAG_SGLANG_VERIFY=splitkv PYTHONPATH=$PLUGIN:$pypath \
  setsid "$PYTHON" -m specdiag.launchers serve $SERVE_ARGS --port "$PORT" --log "$r/server.log" > "$r/serve.out" 2>&1 &
serve_pid=$!
stop_server() {
  kill -INT "$serve_pid" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- -"$serve_pid" 2>/dev/null
  say "server stopped"
}
trap stop_server EXIT
until grep -q "ready at" "$r/serve.out"; do
  if ! kill -0 "$serve_pid" 2>/dev/null || [ $(( $(date +%s) - t0 )) -gt "$READY_S" ]; then
    say "FAILED: the server did not come up"; tail -30 "$r/serve.out" "$r/server.log" 2>/dev/null | tee -a "$log"; exit 6
  fi
  sleep 2
done
say "$(grep -h "plugin splitkv\|ready at" "$r/serve.out" | tr '\n' ' ')"

# the report against it, as `make report SERVER=http://127.0.0.1:$PORT PARAMS=...` runs it
# shellcheck disable=SC2086  # NOTEBOOKS is a list
PYTHONPATH=$pypath "$PYTHON" -m specdiag.report run --server "http://127.0.0.1:$PORT" --params "$PARAMS" \
  --run-dir "$r/live" --notebooks $NOTEBOOKS 2>&1 | tee -a "$log"
say "report exited with ${PIPESTATUS[0]}"
grep -h "specdiag_splitkv\|specdiag\]" "$r/server.log" 2>/dev/null | sort | uniq -c | sort -rn | head -12 | tee -a "$log"
stop_server
trap - EXIT
say "done"
tar czf "$OUT/result.tgz" -C "$r" . && rm -rf "$r"
