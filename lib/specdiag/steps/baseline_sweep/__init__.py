"""Step 01_baseline_sweep: sweep.py (plan, one measured request per row), summary.py (the sweep's findings). The
``sweep`` table read back (resume key, the row per request, the per-context summary) is
:mod:`specdiag.measure.sweep_table`, which 05, 07 and 08 read too."""
