"""Step 04_commit_probe: probe.py (plan, rows, summary, verdicts), plots.py."""
