"""``python -m specdiag.sweep sweep|merge|models ...`` (specdiag.sweep.cli)."""

import sys

from specdiag.sweep.cli import main

sys.exit(main())
