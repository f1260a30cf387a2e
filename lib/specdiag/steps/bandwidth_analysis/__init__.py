"""Step 05_bandwidth_analysis: verdicts.py (05's findings on the measured steps against their floors, its table rows),
plots.py (the figure), verify_projection.py (a stock/fixed pair projected to more layers and context), page.py (the
notebook's sections, one call each). The floors themselves are the library's: :mod:`specdiag.roofline` and
:mod:`specdiag.prefill`."""
