"""Step 03_drafter_inspection: analysis.py (spans, draft timing, engine patch, window check, findings)."""
