#!/usr/bin/env bash
# The kernel A/B on a GPU machine, in one call: python -m specdiag.steps.kernel_ab over the canonical cases and every
# arm, the anchors included where they can run. Run from the repository root:
#
#   OUT=/path/to/results [BUDGET=480] [GATE_S=150] [CASES=...] [ARMS=...] bash scripts/device/kernel_ab_job.sh
#
# Needs python3 with a CUDA torch and Triton (on the H200: torch 2.11, Triton 3.6). The anchors need, in ANCHOR_DIR
# (default .fi, a folder git ignores): FlashInfer's wheels (flashinfer-python 0.6.15.post1, apache-tvm-ffi 0.1.11,
# torch-c-dlpack-ext 0.1.5) and SGLang 0.5.17's sglang/kernels/ops/attention/verify_splitkv.py; docs/gpu-runs.md says
# how to fetch them. FlashInfer JIT-compiles its MLA kernels with nvcc first (35-200 s, in the background beside the
# GPU tests); where that fails, its rows carry the reason.
#
# Steps: provenance (env.txt); the GPU tests of the arms and the timing method as a gate (at most GATE_S s,
# gpu-tests.log); the harness into /tmp/kernel-ab-h200 until BUDGET s from the start; the run folder as
# $OUT/kernel-ab.tar.gz with harness.log beside it. GATE_S=0 skips the gate.
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
BUDGET=${BUDGET:-480}
GATE_S=${GATE_S:-150}
ANCHOR_DIR=${ANCHOR_DIR:-.fi}
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/lib${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
off=()
if ls "$ANCHOR_DIR"/flashinfer_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fisite "$ANCHOR_DIR"/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/fisite   # last: the machine's torch and triton stay first
else
  off=(--flashinfer-off "FlashInfer is not installed on this machine (no wheels in $ANCHOR_DIR)")
fi
[ -f "$ANCHOR_DIR/verify_splitkv.py" ] && export SPECDIAG_SGLANG_VERIFY_PY=$PWD/$ANCHOR_DIR/verify_splitkv.py
{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
  echo "sglang verify_splitkv.py: ${SPECDIAG_SGLANG_VERIFY_PY:-not found}"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

fi_pid=
if [ ${#off[@]} -eq 0 ]; then
  ( timeout 240 python3 -m specdiag.steps.kernel_ab.anchors --warm-flashinfer > "$OUT/flashinfer-jit.log" 2>&1
    echo "exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/flashinfer-jit.log" ) &
  fi_pid=$!
fi
if [ "$GATE_S" -gt 0 ]; then
  timeout "$GATE_S" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py > "$OUT/gpu-tests.log" 2>&1
  echo "gate exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/gpu-tests.log"
  tail -4 "$OUT/gpu-tests.log"
fi
if [ -n "$fi_pid" ]; then
  wait "$fi_pid"
  tail -3 "$OUT/flashinfer-jit.log"
  if ! tail -1 "$OUT/flashinfer-jit.log" | grep -q "^exit 0 "; then
    why=$(grep -v '^exit ' "$OUT/flashinfer-jit.log" | tail -1 | tr -d '\n' | cut -c1-300)
    off=(--flashinfer-off "FlashInfer's MLA kernels did not build or check on this machine: ${why:-no output}")
  fi
fi
run_dir=/tmp/kernel-ab-h200
left=$(( BUDGET - ($(date +%s) - t0) ))
minutes=$(python3 -c "print(max(0.5, ($left - 40) / 60))")
echo "[kernel-ab-job] harness: $left s left, starts no case after $minutes min"
timeout $(( left > 20 ? left - 5 : 15 )) python3 -m specdiag.steps.kernel_ab --out "$run_dir" \
  ${CASES:+--cases "$CASES"} ${ARMS:+--arms "$ARMS"} --max-minutes "$minutes" ${off[@]+"${off[@]}"} \
  > "$OUT/harness.log" 2>&1
echo "[kernel-ab-job] harness exit $? after $(( $(date +%s) - t0 )) s"
cp "$OUT/harness.log" "$run_dir/harness.log" 2>/dev/null
tar -czf "$OUT/kernel-ab.tar.gz" -C "$(dirname "$run_dir")" "$(basename "$run_dir")"
tail -25 "$OUT/harness.log"
