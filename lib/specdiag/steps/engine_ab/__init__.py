"""09_engine_ab: engine arms side by side (attention backends, the plugin, hybrids): decode, ms per step and TTFT
per context, and which arm to run.

- :mod:`.measure`: the same requests against every arm into one ``engine_ab`` table (prefill once, then decode on the
  cached prompt);
- :mod:`.arms`: the arms 09 measures (live servers by URL, or embedded configurations started one after another) and
  each arm's run.json record;
- :mod:`.analysis`: per arm and context (ms per step, decode tokens/s, TTFT, own or not), the rank test, the verdict
  per band, the targets (pure);
- :mod:`.verdicts`: the prefill floor per arm, the findings (each collapse's measured fix, in 07's shape) and the key
  numbers (pure);
- :mod:`.plots`: 09's figures;
- :mod:`.plugin_identity`: the sweep's ``plugin_identity`` measurement (greedy output ids per arm and prompt, judged
  against the reference arm's by :func:`specdiag.identity.compare_arms`).
"""
