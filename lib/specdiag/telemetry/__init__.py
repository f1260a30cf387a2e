"""Device telemetry (02_gpu_utilization): rows.py the row contract every source fills, sampler.py the
background sampler and ``open_source``, cpu.py / nvml.py / prometheus.py the sources. Import the modules:
``from specdiag.telemetry.sampler import Sampler, open_source``."""
