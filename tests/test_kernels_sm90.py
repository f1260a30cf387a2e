"""The sm_90 code of every configuration the SGLang plugin and the pick launch, compiled here without a GPU, hashes
as recorded in tests/data/kernel-ptx-sm90.json (scripts/kernel_ptx_hashes.py): a change of any of those kernels
shows here, and a change that should leave them alone (a move, a rename, a refactor) proves it did. After a
deliberate kernel change, record the new hashes with ``python scripts/kernel_ptx_hashes.py --write`` and say why in
the commit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed here")]

SHARED_LIMIT_SM90 = 232_448  #: bytes of shared memory one block may hold on sm_90


def test_every_shipped_configuration_compiles_to_the_recorded_code_within_the_shared_memory() -> None:
    import triton

    sys.path.insert(0, str(ROOT / "scripts"))
    import kernel_ptx_hashes as k

    rec = k.recorded()
    if rec["triton"] != triton.__version__:
        pytest.skip(f"hashes recorded with Triton {rec['triton']}, this is {triton.__version__}")
    differ, over = [], []
    for name, compile_ in k.configurations().items():
        compiled = compile_()
        if k.ptx_hash(compiled) != rec["hashes"].get(name):
            differ.append(name)
        if compiled.metadata.shared > SHARED_LIMIT_SM90:
            over.append((name, compiled.metadata.shared))
    assert set(rec["hashes"]) == set(k.configurations())
    assert not differ, f"sm_90 code changed for {differ}: a deliberate change records it (--write)"
    assert not over, f"over sm_90's {SHARED_LIMIT_SM90} B of shared memory: {over}"


def test_the_prefill_kernel_assembles_for_sm90_without_spills() -> None:
    """Both loaders of the MHA prefill kernel, in the fingerprinted configurations, fit sm_90's registers (ptxas, as
    Triton assembles them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import kernel_ptx_hashes as k

    prefill = {n: c for n, c in k.configurations().items() if n.startswith("prefill_")}
    assert len(prefill) == 3
    for name, compile_ in prefill.items():
        u = k.ptxas_usage(compile_())
        assert 0 < u["registers"] <= 255 and u["spill_bytes"] == 0, (name, u)
        assert u["shared_bytes"] <= SHARED_LIMIT_SM90, (name, u)
