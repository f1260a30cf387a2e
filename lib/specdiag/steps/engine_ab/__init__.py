"""09_engine_ab: engine arms side by side (attention backends, the plugin, hybrids): decode, ms per step and TTFT
per context, and which arm to run.

- :mod:`.measure`: the same requests against every arm into one ``engine_ab`` table (prefill once, then decode on the
  cached prompt);
- :mod:`.arms`: what an arm's run.json record states (algorithm, backend, tokens per step, verify path; the arms
  themselves are an arms file, measured by the sweep's driver, :mod:`specdiag.sweep.driver`);
- :mod:`.analysis`: per arm and context (ms per step, decode tokens/s, TTFT, own or not), the rank test, the verdict
  per band (the pick against its runner-up over requests), the targets (pure);
- :mod:`.breakeven`: where speculation stops paying, each arm against its speculation-off twin (pure);
- :mod:`.window`: what a DFLASH drafter costs without its draft window, two arms that verify alike (pure);
- :mod:`.answer`: the one answer, which arm to run, the first token weighed against decode by output length (pure);
- :mod:`.verdicts`: the prefill floor per arm, the findings (each collapse's measured fix, in 07's shape) and the key
  numbers (pure);
- :mod:`.plots`: 09's figures;
- :mod:`.plugin_identity`: the sweep's ``plugin_identity`` measurement (greedy output ids per arm and prompt, judged
  against the reference arm's by :func:`specdiag.identity.compare_arms`).
"""
