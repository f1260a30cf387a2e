"""``python -m specdiag.report ...`` (the Makefile's report, notebook and replay)."""

import sys

from specdiag.report import main

sys.exit(main())
