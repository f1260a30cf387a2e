"""09_engine_ab: engine arms side by side (attention backends, the plugin, hybrids): decode, ms per step and TTFT
per context, and which arm to run.

- :mod:`.measure`: the same requests against every arm into one ``engine_ab`` table (prefill once, then decode on the
  cached prompt).
"""
