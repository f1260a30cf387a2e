"""Step 02_gpu_utilization: record.py (one request inside a sampler window), analysis.py (phases, prediction,
findings), plot.py (the timeline), timeline.py (torch profiler traces, step by step), page.py (the notebook's
sections, one call each)."""
