"""Step 03_drafter_inspection: analysis.py (spans, draft timing over requests, engine patch, window check, findings),
dflash.py (the DFLASH block drafter, its window on and off), page.py (the notebook's sections, one call each)."""
