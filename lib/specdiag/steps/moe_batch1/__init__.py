"""11_moe_batch1: at batch 1, which experts does one verify pass touch, what share of the step are expert weights,
how does it grow with draft tokens, and how balanced would expert parallelism be?

- :mod:`.recorder`: SGLang 0.5.17's expert-distribution dump (per_pass) read as its source writes it;
- :mod:`.routing`: distinct experts per pass and layer, per window of a request's routed experts, the uniform
  expectation and the spread check (pure);
- :mod:`.balance`: expert parallelism against tensor parallelism, distinct experts and tokens per rank, from the
  counts (pure);
- :mod:`.cost`: the bytes of a step, the expert share, the measured step times against T, the projection to Kimi
  K2.6 on 8 GPUs, the best number of draft tokens (pure);
- :mod:`.measure`: the live recorder pass, timed requests and a routed-experts request on an SGLang server;
- :mod:`.analysis`: a run folder's dumps and rows into tables and findings;
- :mod:`.page`: the notebook's sections, one call each (tables, figures and text).
"""
