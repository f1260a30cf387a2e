"""06_kernel_ab: MLA verify attention kernels side by side at batch 1, against the floors.

- :mod:`.arms`: the arms (a name, what it is, the layout and cache it reads, a config passed through unchanged)
  and the call each makes;
- :mod:`.timing`: CUDA-graph replays with the L2 flushed before each, and the same-bytes copy;
- :mod:`.anchors`: FlashInfer's MLA kernel and SGLang's own split-KV kernel on the same inputs;
- :mod:`.harness`: every arm on every case into a run folder (``python -m specdiag.steps.kernel_ab``);
- :mod:`.analysis`: tables, the targets and the findings, pure functions of the rows (read back through
  :mod:`specdiag.kernel_ab_table`, which 10 reads too);
- :mod:`.plots`: 06's figures.
- :mod:`.page`: 06's sections, one call each (the notebook keeps its parameters, these calls and its prose).
"""
