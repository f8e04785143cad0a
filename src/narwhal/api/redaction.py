"""Engine addresses out of what clients read: the one redaction every client-facing error
message passes.

An engine's failure is told in the words of the layer that saw it, and the engine layer
names the engine's address (`127.0.0.1:8001 closed the connection mid-body`), which the
router's log keeps for operators. A client learns the engine's name instead: the
completion front renders every error it answers with through `EngineRedaction`, whether
it goes out as a status before the response started or as a stream's last event after
(`narwhal.api.completions`, `narwhal.api.relay`). Each form of a configured engine's
address becomes its name in angle brackets (`<h0>`), its bare host `<engine host>`.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from narwhal.config import EngineConfig


def addresses_of(url: str) -> list[str]:
    """The forms an engine's address takes in error texts: its URL and host:port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return [url.rstrip("/"), parts.netloc, f"{parts.hostname}:{port}"]


class EngineRedaction:
    """`redact(message)`: `message` with every known engine address replaced by the
    engine's name. Built per configuration (`for_engines`); an engine a reload removed
    stays known, since requests in flight on it may still fail with its address."""

    __slots__ = ("_known", "_pairs")

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self._known: dict[str, str] = dict(known or {})  # address form -> replacement
        # Longest first: a URL before the host:port inside it, that before the host.
        self._pairs = sorted(self._known.items(), key=lambda pair: -len(pair[0]))

    def for_engines(self, engines: Iterable[EngineConfig]) -> EngineRedaction:
        """This redaction, knowing `engines` too (their names win for an address)."""
        known = dict(self._known)
        engines = list(engines)
        for engine in engines:
            host = urlsplit(engine.url).hostname
            if host:
                known[host] = "<engine host>"
        for engine in engines:
            for address in addresses_of(engine.url):
                if address:
                    known[address] = f"<{engine.name}>"
        return EngineRedaction(known)

    def redact(self, message: str) -> str:
        for address, replacement in self._pairs:
            if address in message:
                message = message.replace(address, replacement)
        return message
