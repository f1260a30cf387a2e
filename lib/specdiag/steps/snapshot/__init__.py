"""Step 00_snapshot: settings.py (server, model and machine rows), findings.py (verdicts, peak rows)."""
