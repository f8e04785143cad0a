"""What one request to an engine is on the wire: its origin (scheme, host, port, the base
URL's path) and the request's bytes, head and body, for one write (sans-IO).

Every piece a caller gives is checked before it is written: a method and header names
that are HTTP tokens, an origin-form path, header values without CR, LF or NUL, and none
of the headers the client sets itself (Host, Content-Length, Transfer-Encoding).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

_TOKEN: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_TARGET: Final = re.compile(r"/[!-~]*")  # origin-form: visible ASCII, no spaces
_SET_BY_CLIENT: Final = frozenset({"host", "content-length", "transfer-encoding"})


@dataclass(frozen=True, slots=True)
class Origin:
    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    label: str  # "host:port", for messages
    host_header: str
    prefix: str  # the base URL's path, before every request path


def parse_origin(url_base: str) -> Origin:
    parts = urllib.parse.urlsplit(url_base)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {url_base!r}")
    host = parts.hostname
    if not host or parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"not an engine base URL (host, port, path): {url_base!r}")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid port in {url_base!r}") from e
    default = 443 if scheme == "https" else 80
    if port is None:
        port = default
    shown = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return Origin(
        key=(scheme, host, port),
        host=host,
        port=port,
        tls=scheme == "https",
        label=f"{shown}:{port}",
        host_header=shown if port == default else f"{shown}:{port}",
        prefix=parts.path.rstrip("/"),
    )


def request_bytes(
    origin: Origin, method: str, path: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """The whole request, head and body, for one write."""
    if _TOKEN.fullmatch(method) is None:
        raise ValueError(f"invalid method {method!r}")
    if method in ("HEAD", "CONNECT"):
        # Their responses are framed differently (RFC 9112 §6.3); engines need neither.
        raise ValueError(f"{method} requests are not supported")
    if _TARGET.fullmatch(path) is None:
        raise ValueError(f"invalid request path {path!r}")
    lines = [f"{method} {origin.prefix}{path} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"invalid header name {name!r}")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name} has a CR, LF or NUL in its value")
        if name.lower() in _SET_BY_CLIENT:
            raise ValueError(f"header {name} is set by the client itself")
        lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    # UTF-8 as aiohttp writes header values (an engine never sees anything but ASCII).
    return "".join(lines).encode() + body
