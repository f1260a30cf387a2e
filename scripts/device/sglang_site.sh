# Sourced by the SGLang device jobs (sweep_job.sh): SGLang 0.5.17's
# site tree and the plugin, put in place the same way for every job. Run from the repository root.
#
# stage_sglang_site SITE LOG TAG: nothing if SITE already holds sglang; otherwise joins $STAGE_DIR/part.* (default /tmp/stage;
#   staged by earlier calls: part.00 carried in .rs1, or part.00-part.02 in .rsA-.rsC when the checkout leaves each call
#   only ~20 MB to carry) with .rs2/part.* (carried now), in name order, checks the sha256 against .rs2/SHA256SUMS and
#   extracts into SITE. Returns 2 (parts missing), 3 (sha256 unknown) or 4 (extract failed), saying why in LOG.
# write_sglang_env SITE FILE: the call's provenance into FILE and on stdout (date, code, GPU and driver, the versions of
#   python, torch, triton and, from SITE, sglang, flashinfer, transformers).
# install_plugin TARGET LOG TAG: plugins/sglang into TARGET with pip, offline; where pip cannot, the package and a
#   hand-written dist-info with the same entry point (sglang.srt.plugins: specdiag_splitkv).

stage_sglang_site() {
  local site=$1 log=$2 tag=$3 stage=${STAGE_DIR:-/tmp/stage} h
  [ -f "$site/sglang/version.py" ] && return 0
  if [ ! -f "$stage/part.00" ] || ! compgen -G ".rs2/part.*" >/dev/null; then
    echo "[$tag] FAILED: no SGLang at $site and no $stage/part.00 + .rs2/part.* to join: stage it first" \
      "(scripts/device/README.md)" | tee -a "$log"
    return 2
  fi
  h=$(cat "$stage"/part.* .rs2/part.* | sha256sum | cut -c1-64)
  grep -q "^$h  sglang" .rs2/SHA256SUMS || { echo "[$tag] FAILED: sha256 $h not in .rs2/SHA256SUMS" | tee -a "$log"; return 3; }
  mkdir -p "$site" && cat "$stage"/part.* .rs2/part.* | xz -d | tar -x -C "$site" \
    || { echo "[$tag] FAILED: extract" | tee -a "$log"; return 4; }
  echo "[$tag] extracted SGLang into $site (sha256 $h)" | tee -a "$log"
}

install_plugin() {
  local target=$1 log=$2 tag=$3
  rm -rf "$target"
  if python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$target" plugins/sglang >> "$log" 2>&1; then
    echo "[$tag] plugin installed with pip into $target" | tee -a "$log"
  else
    echo "[$tag] pip could not install it offline: the package and its dist-info by hand" | tee -a "$log"
    mkdir -p "$target/specdiag_sglang_plugin-0.1.0.dist-info"
    cp -r plugins/sglang/specdiag_sglang_plugin "$target/"
    printf 'Metadata-Version: 2.1\nName: specdiag-sglang-plugin\nVersion: 0.1.0\n' \
      > "$target/specdiag_sglang_plugin-0.1.0.dist-info/METADATA"
    printf '[sglang.srt.plugins]\nspecdiag_splitkv = specdiag_sglang_plugin:register\n' \
      > "$target/specdiag_sglang_plugin-0.1.0.dist-info/entry_points.txt"
  fi
  rm -rf plugins/sglang/build plugins/sglang/*.egg-info
}

write_sglang_env() {
  local site=$1 file=$2
  {
    echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo none)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    PYTHONPATH=$site python3 -c "import sys, torch, triton, sglang, flashinfer, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'sglang', sglang.__version__, 'flashinfer', flashinfer.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
  } > "$file" 2>&1
  cat "$file"
}
