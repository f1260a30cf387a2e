"""Step 05_bandwidth_analysis: roofline.py (floors, effective bandwidth, findings), plots.py (the figure)."""
