#!/usr/bin/env bash
# One device call (issue 13): the kernel A/B of the single-launch split-KV kernel, its fp8-KV form and the anchors
# on the issue's target shapes, bounded to BUDGET seconds of work (default 240).
# Run from the repository root:  bash scripts/device/kernel_ab_job.sh
#
# Needs on the device: python3 with a CUDA torch and Triton (the H200 image has torch 2.11 + Triton 3.6). The
# SGLang anchor needs SGLang 0.5.17's verify_splitkv.py: at $SGLANG_SITE (default /tmp/site) or carried as
# .anchors/verify_splitkv.py (ignored by git; copy it before the call, see docs/kernel-notes.md "run 4").
# FlashInfer is not run by default (it JIT-compiles with nvcc on first use: minutes); FLASHINFER=1 asks for it:
# flashinfer from the machine, else from the staged SGLang site ($SGLANG_SITE, default /tmp/site: SGLang 0.5.17
# ships flashinfer-python 0.6.15.post1), built by `python -m specdiag.kernels.anchors --warm-flashinfer` in the
# background while the gate runs (at most FI_JIT_S s, default 180; JIT cache under /tmp/fi-ws); the harness runs
# it only when that build and check passed, otherwise every case gets a flashinfer row with the reason.
#
# Measures, in one harness process (python -m specdiag.kernels.harness): copy bandwidth and bf16 matmul rate,
# copies of each context's KV traffic, then chain-draft cases (so the anchors can run them) in order of
# importance, each on shuffled_p1 and shuffled_b64: 128k h8T1, h16T1, h8T8; 256k and 64k of the same; 128k
# h16T16, h16T64, h128T8. Kernels: split_p1/split_b64 (run 2's two launches), fused_p1/fused_b64 (one launch),
# fused_fp8_p1/fused_fp8_b64, sglang_splitkv_p1. The harness stops starting cases at BUDGET - 45 s.
# First a gate of at most GATE_S s (default 45): tests/test_kernels_gpu.py -k "$GATE_K" (default: fused, the fused
# kernels vs the reference, twice each; run 4's 45 s passed 2 of its 6 tests, the rest went to Triton compiles).
# Run 5 (docs/kernel-notes.md "Run 5 (planned)") narrows the call with KERNELS, LAYOUTS, CASES, GATE_S, GATE_K and
# SGLANG_ANCHOR=0 (run 4's defaults otherwise); run 6 ("Run 6 (planned)") the same way, with GATE_K=tile64.
# ANATOMY_CASES (run 7): after the harness, `python -m specdiag.kernels.anatomy` on these context:heads:draft cases
# into the same run folder (table kernel_anatomy: each part of a split call timed alone), within the budget left.
# $OUT receives (at most 8 files): kernel-ab.tar.gz (the run folder: run.json, kernel_ab.jsonl,
# kernel_ab_copy.jsonl, harness.log), job.log, env.txt, gpu-tests.log, flashinfer-jit.log, targets.txt (also printed last).
set -uo pipefail
OUT=${OUT:?set OUT to the folder to write results to}
BUDGET=${BUDGET:-240}
FLASHINFER=${FLASHINFER:-0}
SGLANG_ANCHOR=${SGLANG_ANCHOR:-1}
GATE_S=${GATE_S:-45}
GATE_K=${GATE_K:-fused}
KERNELS=${KERNELS:-split_p1,split_b64,fused_p1,fused_b64,fused_fp8_p1,fused_fp8_b64}
LAYOUTS=${LAYOUTS:-shuffled_p1,shuffled_b64}
FI_JIT_S=${FI_JIT_S:-180}
SGLANG_SITE=${SGLANG_SITE:-/tmp/site}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/lib${PYTHONPATH:+:$PYTHONPATH}
if [ "$FLASHINFER" = 1 ] && ! python3 -c "import flashinfer" 2>/dev/null && [ -d "$SGLANG_SITE/flashinfer" ]; then
  export PYTHONPATH=$PYTHONPATH:$SGLANG_SITE   # last: the machine's torch, triton, transformers stay first
fi
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
run_dir=/tmp/kernel-ab-issue13
rm -rf "$run_dir"
t0=$(date +%s)
{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
  python3 -c "from specdiag.kernels.anchors import find_sglang_verify as f; print('sglang verify_splitkv.py:', f())" 2>&1 | tail -1
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
  command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "nvcc: not on PATH"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# FlashInfer's nvcc JIT in the background, beside the gate (CPU-bound compiles; the gate's GPU work is small)
fi_pid=
if [ "$FLASHINFER" = 1 ]; then
  ( timeout "$FI_JIT_S" python3 -m specdiag.kernels.anchors --warm-flashinfer > "$OUT/flashinfer-jit.log" 2>&1
    echo "exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/flashinfer-jit.log" ) &
  fi_pid=$!
fi

# a gate of at most GATE_S s: the fused kernels on odd shapes, twice each (counters reset), bf16 and fp8
echo "[kernel-ab-job] gate: timeout $GATE_S pytest -k \"$GATE_K\"" > "$OUT/gpu-tests.log"
timeout "$GATE_S" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k "$GATE_K" >> "$OUT/gpu-tests.log" 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/gpu-tests.log"
tail -3 "$OUT/gpu-tests.log"

extra=()
if [ "$SGLANG_ANCHOR" = 1 ]; then extra+=(--sglang-anchor); fi
if [ -n "$fi_pid" ]; then
  wait "$fi_pid"
  tail -4 "$OUT/flashinfer-jit.log"
  if tail -1 "$OUT/flashinfer-jit.log" | grep -q "^exit 0 "; then
    extra+=(--flashinfer)
  else
    why=$(grep -v '^exit ' "$OUT/flashinfer-jit.log" | tail -1 | tr -d '\n' | cut -c1-300)
    extra+=(--flashinfer-off "FlashInfer's MLA kernels did not build or check in this call ($(tail -1 "$OUT/flashinfer-jit.log")): ${why:-no output}")
  fi
fi
cases=${CASES:-131072:8:1,131072:16:1,131072:8:8,262144:8:1,262144:16:1,262144:8:8,65536:8:1,65536:16:1,65536:8:8,131072:16:16,131072:16:64,131072:128:8}
left=$(( BUDGET - ($(date +%s) - t0) ))
minutes=$(python3 -c "print(max(0.5, ($left - 45) / 60))")
echo "[kernel-ab-job] harness: $left s left, stops starting cases after $minutes min" | tee "$OUT/job.log"
timeout $(( left - 10 )) python3 -m specdiag.kernels.harness --out "$run_dir" --grid full --layouts "$LAYOUTS" \
  --cases "$cases" --chain --kernels "$KERNELS" ${extra[@]+"${extra[@]}"} \
  --max-minutes "$minutes" > "$run_dir.log" 2>&1
rc=$?
echo "[kernel-ab-job] harness exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/job.log"
mkdir -p "$run_dir" && cp "$run_dir.log" "$run_dir/harness.log"
if [ -n "${ANATOMY_CASES:-}" ]; then
  left=$(( BUDGET - ($(date +%s) - t0) ))
  minutes=$(python3 -c "print(max(0.3, ($left - 25) / 60))")
  echo "[kernel-ab-job] anatomy: $left s left, stops starting cases after $minutes min" | tee -a "$OUT/job.log"
  timeout $(( left > 20 ? left - 10 : 10 )) python3 -m specdiag.kernels.anatomy --out "$run_dir" --cases "$ANATOMY_CASES" \
    --max-minutes "$minutes" > "$run_dir/anatomy.log" 2>&1
  echo "[kernel-ab-job] anatomy exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/job.log"
  grep -v "anatomy cases" "$run_dir/anatomy.log" | tail -60 | tee -a "$OUT/job.log"
fi
tail -40 "$run_dir.log" >> "$OUT/job.log"
tar -czf "$OUT/kernel-ab.tar.gz" -C "$(dirname "$run_dir")" "$(basename "$run_dir")"
python3 -m specdiag.kernels.summary "$run_dir" > "$OUT/targets.txt" 2>&1
echo "[kernel-ab-job] done in $(( $(date +%s) - t0 )) s; targets:"
cat "$OUT/targets.txt"
