"""Step 01_baseline_sweep: page.py (the notebook's sections, one call each), plots.py (its two figures),
summary.py (the sweep's findings). The sweep plan and its measured request live in
:mod:`specdiag.measure.sweep_plan`, since 05 measures the same sweep. The
``sweep`` table read back (resume key, the row per request, the per-context summary) is
:mod:`specdiag.measure.sweep_table`, which 05, 07 and 08 read too."""
