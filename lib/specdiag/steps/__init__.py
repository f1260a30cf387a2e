"""One package per investigation step, named like its notebook: snapshot (00), baseline_sweep (01),
gpu_utilization (02), drafter_inspection (03), commit_probe (04), bandwidth_analysis (05), findings (07, 08).
06_kernel_ab's code is :mod:`specdiag.kernels`. Importing a step for replay imports no server client."""
