"""Step 07_findings and 08_compare_runs: overview.py (one run's findings, two runs side by side)."""
