"""What every measuring step shares: fresh_prompt.py (a prompt no prefix cache serves), metrics.py (one
request's row from its trace), request.py (one measured request), loop.py (measure what is missing),
disturbance.py (other traffic while measuring) and sweep_table.py (01's sweep rows read back: the row per request,
the summary per context).
Server clients are imported only inside the functions that talk to a server."""
