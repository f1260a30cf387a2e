#!/usr/bin/env bash
# Last plugin call (nvidia-h200-x2): TP 2 greedy identity stock vs plugin, and the logprob evidence for every
# prompt that differs (scripts/sglang_plugin_last.py). Run from the repository root, carrying .rs1 and .rs2:
#   mkdir -p /tmp/stage && cp .rs1/part.00 /tmp/stage/ && bash scripts/device/sglang_plugin_last.sh
# Bounded by TOTAL (default 420 s from the start, everything included): staging SGLang as
# scripts/device/sglang_plugin_job.sh does, the plugin offline into /tmp/plugin, the MLA model (2 layers, seed 0),
# then the driver with the time left less 25 s (timeout kills it 20 s past that). Both servers start at
# --tp-size 2 in parallel (start-up limit STARTUP_S, default 240 s); if they are not ready, TP 1 (one GPU each).
# $OUT receives (<= 8 files): sglang-plugin-last.tar.gz (identity.jsonl with the logprob rows, server logs,
# stats-<arm>/ per rank, run folders, summary.txt, failures.json), last.log (the driver), env.txt, summary.txt.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
TOTAL=${TOTAL:-420}
STARTUP_S=${STARTUP_S:-240}
SITE=${SITE:-/tmp/site}
PLUGIN=${PLUGIN_TARGET:-/tmp/plugin}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
t0=$(date +%s)
work=/tmp/sglang-plugin-last
rm -rf "$work"; mkdir -p "$work"
env_log="$OUT/env.txt"; : > "$env_log"
finish() {
  tar -C "$work" -czf "$OUT/sglang-plugin-last.tar.gz" . 2>>"$env_log"
  cat "$env_log"
  grep -E "FAILED|identity (short|long)" "$OUT/last.log" 2>/dev/null | cut -c1-400 | head -40
  cat "$OUT/summary.txt" 2>/dev/null
}

if [ ! -f "$SITE/sglang/version.py" ]; then
  if [ -f /tmp/stage/part.00 ] && compgen -G ".rs2/part.*" >/dev/null; then
    h=$(cat /tmp/stage/part.00 .rs2/part.* | sha256sum | cut -c1-64)
    grep -q "^$h  sglang" .rs2/SHA256SUMS || { echo "[last] FAILED: sha256 $h not in .rs2/SHA256SUMS" | tee -a "$env_log"; finish; exit 3; }
    mkdir -p "$SITE" && cat /tmp/stage/part.00 .rs2/part.* | xz -d | tar -x -C "$SITE" || { echo "[last] FAILED: extract" | tee -a "$env_log"; finish; exit 4; }
    echo "[last] extracted SGLang into $SITE (sha256 $h) after $(( $(date +%s) - t0 )) s" | tee -a "$env_log"
  else
    echo "[last] FAILED: no SGLang at $SITE and no /tmp/stage/part.00 + .rs2/part.* to join" | tee -a "$env_log"
    finish; exit 2
  fi
fi

rm -rf "$PLUGIN"
if python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$PLUGIN" plugins/sglang >> "$env_log" 2>&1; then
  echo "[last] plugin installed with pip into $PLUGIN" | tee -a "$env_log"
else
  echo "[last] pip could not install it offline: the package and its dist-info by hand" | tee -a "$env_log"
  mkdir -p "$PLUGIN/specdiag_sglang_plugin-0.1.0.dist-info"
  cp -r plugins/sglang/specdiag_sglang_plugin "$PLUGIN/"
  printf 'Metadata-Version: 2.1\nName: specdiag-sglang-plugin\nVersion: 0.1.0\n' \
    > "$PLUGIN/specdiag_sglang_plugin-0.1.0.dist-info/METADATA"
  printf '[sglang.srt.plugins]\nspecdiag_splitkv = specdiag_sglang_plugin:register\n' \
    > "$PLUGIN/specdiag_sglang_plugin-0.1.0.dist-info/entry_points.txt"
fi
rm -rf plugins/sglang/build plugins/sglang/*.egg-info
export PYTHONPATH=$SITE:$PLUGIN:$PWD/lib
{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>&1
  python3 -c "import sglang; print('sglang', sglang.__version__)" 2>&1 | tail -1
} >> "$env_log" 2>&1
timeout 60 python3 data/models/make_mla_model.py --out /tmp/mla-model --layers 2 --seed 0 2>&1 | tail -1 | tee -a "$env_log"

n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
tp=2; [ "$n_gpus" -ge 2 ] || tp=1
left=$(( TOTAL - ($(date +%s) - t0) - 25 ))
echo "[last] driver: TP $tp ($n_gpus GPUs), budget ${left} s, start-up limit ${STARTUP_S} s" | tee -a "$env_log"
# shellcheck disable=SC2086
timeout --signal=TERM --kill-after=10 $((left + 10)) python3 scripts/sglang_plugin_last.py --out "$work" \
  --model-path /tmp/mla-model --site "$SITE" --plugin-path "$PLUGIN" --budget-s "$left" --tp-size "$tp" \
  --startup-s "$STARTUP_S" --fallback-tp1 $EXTRA > "$OUT/last.log" 2>&1
rc=$?
echo "[last] driver exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$env_log"
cp "$work/summary.txt" "$OUT/summary.txt" 2>/dev/null || sed -n '/^=== summary/,$p' "$OUT/last.log" > "$OUT/summary.txt"
finish
exit $rc
