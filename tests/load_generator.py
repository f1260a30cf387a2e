"""A bounded load generator for tests: other users' traffic beside the suite, on 127.0.0.1 only.

``with LoadGenerator(url, engine="sglang", concurrency=2, max_requests=40): ...`` keeps ``concurrency`` greedy
requests in flight against a server on this machine (SGLang's /generate, or vLLM's /v1/completions) until the
block ends or ``max_requests`` were sent, whichever comes first; ``max_seconds`` bounds it too. It refuses any host
but 127.0.0.1/localhost. ``sent``/``finished``/``errors`` count what it did; ``wait_busy()`` blocks until the
server has generated for it (its first request finished), so a test measures beside traffic that is running.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import requests

PROMPT = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. " * 12


class LoadGenerator:
    def __init__(self, url: str, engine: str = "sglang", concurrency: int = 1, max_requests: int = 50,
                 max_new_tokens: int = 48, max_seconds: float = 300.0, api_key: str | None = None,
                 model: str | None = None) -> None:
        host = urlsplit(url).hostname
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the load generator only loads a server on this machine; got {host!r}")
        if not 1 <= concurrency <= 8 or not 1 <= max_requests <= 1000:
            raise ValueError("concurrency must be 1..8 and max_requests 1..1000 (a bounded load)")
        self.url = url.rstrip("/")
        self.engine = engine
        self.concurrency = concurrency
        self.max_requests = max_requests
        self.max_new_tokens = max_new_tokens
        self.max_seconds = max_seconds
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.sent = self.finished = self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first_done = threading.Event()
        self._threads: list[threading.Thread] = []

    def _body(self) -> tuple[str, dict]:
        if self.engine == "vllm":
            return "/v1/completions", {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_new_tokens,
                                       "temperature": 0.0, "ignore_eos": True}
        return "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": self.max_new_tokens,
                                                                 "temperature": 0.0, "ignore_eos": True}}

    def _take(self) -> bool:
        with self._lock:
            if self._stop.is_set() or self.sent >= self.max_requests:
                return False
            self.sent += 1
            return True

    def _worker(self, deadline: float) -> None:
        path, body = self._body()
        while time.monotonic() < deadline and self._take():
            try:
                r = requests.post(self.url + path, json=body, headers=self.headers, timeout=120)
                ok = r.ok
            except requests.RequestException:
                ok = False
            with self._lock:
                self.finished += 1
                self.errors += int(not ok)
            self._first_done.set()

    def start(self) -> "LoadGenerator":
        if self.engine == "vllm" and self.model is None:
            data = requests.get(self.url + "/v1/models", headers=self.headers, timeout=30).json()
            self.model = data["data"][0]["id"]
        deadline = time.monotonic() + self.max_seconds
        for i in range(self.concurrency):
            t = threading.Thread(target=self._worker, args=(deadline,), name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_busy(self, timeout_s: float = 120.0) -> None:
        if not self._first_done.wait(timeout_s):
            raise TimeoutError(f"the load generator's first request did not finish within {timeout_s} s")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
