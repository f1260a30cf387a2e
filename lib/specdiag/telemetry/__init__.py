"""Device telemetry (02_gpu_utilization): rows.py the row contract every source fills, sampler.py the
background sampler and ``open_source``, cpu.py / nvml.py / prometheus.py the sources. Import the modules:
``from specdiag.telemetry.sampler import Sampler, open_source``. torch_trace.py (with its name tables in
trace_tables.py) reads a torch profiler trace of a server and splits each decode step's time into kernel
classes, GPU idle and CPU phases, and keeps those rows in a run folder's step_profile table."""
