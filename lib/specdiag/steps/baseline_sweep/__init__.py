"""Step 01_baseline_sweep: sweep.py (the sweep plan and its measured request, which
live in :mod:`specdiag.measure.sweep_plan` since 05 measures the same sweep), summary.py (the sweep's findings). The
``sweep`` table read back (resume key, the row per request, the per-context summary) is
:mod:`specdiag.measure.sweep_table`, which 05, 07 and 08 read too."""
