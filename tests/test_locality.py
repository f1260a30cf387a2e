"""One answer to "is the server on this machine" (specdiag.serving.locality), used by the peak bandwidth
(hardware.peaks_for_run, 00, 05) and by 02's telemetry locality."""

from __future__ import annotations

import socket

from specdiag import hardware
from specdiag.serving.locality import is_local_host, is_local_url, url_host
from specdiag.steps.gpu_utilization import analysis


def test_loopback_this_host_and_the_embedded_server_are_local() -> None:
    for url in ("", None, "http://127.0.0.1:30000", "http://localhost:1", "http://[::1]:8000", "http://0.0.0.0:2",
                f"http://{socket.gethostname()}:30000", "http://LOCALHOST:3"):
        assert is_local_url(url), url
    assert not is_local_url("http://gpu-host:30000")
    assert is_local_url("http://gpu-host:30000", also=["gpu-host"]) and is_local_host("GPU-host", also=["gpu-host"])
    assert url_host("http://Gpu-Host:1/x") == "gpu-host" and url_host("") == ""


def test_both_callers_ask_the_same_function() -> None:
    assert hardware.is_local_url is is_local_url
    here = {"kind": "cpu", "host": "box"}
    for url in ("http://127.0.0.1:1", f"http://{socket.gethostname()}:1", "http://box:1", "http://far:1", ""):
        assert analysis.telemetry_locality(url, here)["same_machine"] == is_local_url(url, also=["box"]), url


def test_a_label_or_a_schemeless_address_is_read_as_a_host():
    # A replayed run passes a label, not a URL: it must not count as a server on this machine (a replay once
    # measured CUDA on a CPU-only host because the label parsed to an empty host).
    assert not is_local_url("recorded run")
    assert url_host("127.0.0.1:30000") == "127.0.0.1"
    assert is_local_url("localhost:8000")
    assert not is_local_url("gpu-host:30000")
