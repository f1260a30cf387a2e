"""The one answer to "is the server on this machine": by the host of its URL (pure apart from this machine's
host name). An empty URL is the embedded server, started here. Used by 00's and 05's peak bandwidth (read this
machine's GPU only for a server on it) and by 02's telemetry locality (is the sampled device the server's).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from urllib.parse import urlparse

#: Host names that always mean this machine (loopback, the unspecified address, none at all).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", ""})


def url_host(url: str | None) -> str:
    """The URL's host name, lower case ('' for an empty URL). Text without a scheme is read as a host
    ('127.0.0.1:30000' -> '127.0.0.1'; a label such as 'recorded run' is its own host, so never this machine)."""
    if not url:
        return ""
    return (urlparse(url if "://" in url else f"http://{url}").hostname or "").lower()


def is_local_host(host: str | None, also: Iterable[str] = ()) -> bool:
    """True for a loopback name, this machine's host name, or one of ``also`` (e.g. the host a telemetry
    source reports for itself)."""
    name = (host or "").lower()
    return name in LOOPBACK_HOSTS or name in {socket.gethostname().lower(), *(h.lower() for h in also if h)}


def is_local_url(url: str | None, also: Iterable[str] = ()) -> bool:
    """True when the server at ``url`` runs on this machine (an empty URL: the embedded server, here)."""
    return not url or is_local_host(url_host(url), also)
