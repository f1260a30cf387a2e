"""What every measuring step shares: fresh_prompt.py (a prompt no prefix cache serves), metrics.py (one
request's row from its trace), request.py (one measured request) and loop.py (measure what is missing).
Server clients are imported only inside the functions that talk to a server."""
