"""Step 01_baseline_sweep: sweep.py (plan, one measured request per row, resume keys), summary.py (per-context summary, findings)."""
