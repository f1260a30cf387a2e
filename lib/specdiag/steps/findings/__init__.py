"""Step 07_findings and 08_compare_runs: overview.py (one run's findings, two runs side by side), diagnosis.py,
run_checks.py and page.py (07's opening diagnosis, run-wide checks and page), ddtree.py (07's word on DDTree),
compare_page.py (08's sections, one call each), step_profile_view.py (08's view of the runs' step profiles)."""
