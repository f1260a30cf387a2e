"""Step 05_bandwidth_analysis: roofline.py (floors, effective bandwidth, findings), plots.py (the figure), verify_projection.py (a stock/fixed pair projected to more layers and context)."""
