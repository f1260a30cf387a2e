"""specdiag: diagnostic notebooks for long-context speculative decoding.

Each concern lives in the module named for it (see docs/ARCHITECTURE.md):
client, localserver, prompts, runs, metrics, spec, telemetry, hardware, geometry,
roofline, kernels, findings, plots, report.
"""

__version__ = "0.1.0"
