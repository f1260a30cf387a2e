"""Step 02_gpu_utilization: record.py (one request inside a sampler window), analysis.py (phases, prediction, findings), plot.py (the timeline)."""
