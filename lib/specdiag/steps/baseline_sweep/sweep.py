"""01's sweep plan and measured request, under the name 01 imports them by: they live in
:mod:`specdiag.measure.sweep_plan`, below the steps, since 05 measures the same sweep on a live run without 01's rows."""

from specdiag.measure.sweep_plan import SweepPlan, make_plan, measure_request

__all__ = ["SweepPlan", "make_plan", "measure_request"]
