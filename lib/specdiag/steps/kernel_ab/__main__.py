"""``python -m specdiag.steps.kernel_ab``: the kernel A/B harness (specdiag.steps.kernel_ab.harness)."""

from specdiag.steps.kernel_ab.harness import main

raise SystemExit(main())
