"""`python health_poller.py URL SECONDS`: `GET /health` every 10 ms for SECONDS, on one
keep-alive connection; prints each answer's latency in seconds, as a JSON list.

A process of its own, so that what it measures is the router's answer, not the time the
test's loop (busy writing an engine's flood) or the GIL take to get to it."""

from __future__ import annotations

import http.client
import json
import sys
import time


def main() -> None:
    url, seconds = sys.argv[1], float(sys.argv[2])
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
        if response.status != 200:
            sys.exit(f"/health answered {response.status}")
        time.sleep(0.01)
    print(json.dumps(latencies))


if __name__ == "__main__":
    main()
