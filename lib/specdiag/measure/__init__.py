"""What every measuring step shares: fresh_prompt.py (a prompt no prefix cache serves), metrics.py (one
request's row from its trace), request.py (one measured request), loop.py (measure what is missing),
disturbance.py (other traffic while measuring), sweep_plan.py (a sweep's plan and its row per request: 01's, and
05's on a live run without them) and sweep_table.py (01's sweep rows read back: the row per request, the summary per
context).
Server clients are imported only inside the functions that talk to a server."""
