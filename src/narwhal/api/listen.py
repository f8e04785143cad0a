"""The router's listening sockets, bound before anything else starts.

A port in use (or an address this host does not have) is found before a client session
is opened or an engine probed, so `narwhal serve` can say so in one line and exit with
nothing to clean up. The sockets are bound but not listening: until the application has
started (the fleet's first probes, the first profiles) a client is refused at once rather
than left waiting in the backlog; `listen()` comes with the site's start.

As asyncio's own `create_server` does: every address the host name resolves to gets a
socket, SO_REUSEADDR (a restarted router may bind while its predecessor's connections are
in TIME_WAIT; Linux still refuses a port another socket listens on), and IPv6 sockets
IPV6_V6ONLY, so that "::" and "0.0.0.0" can be bound side by side.
"""

from __future__ import annotations

import socket


class CannotListen(Exception):
    """The router cannot listen where it is told to; str() says where and why."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        shown = f"[{host}]" if ":" in host else host
        super().__init__(f"cannot listen on {shown}:{port}: {reason}")


def bind_sockets(host: str, port: int, *, reuse_port: bool = False) -> list[socket.socket]:
    """Bound TCP sockets for every address of `host` (port 0: a free port each).
    `reuse_port`: shared with the other processes that bind it so (SO_REUSEPORT: relay
    workers, each with its own accept queue, the kernel spreading connections)."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise CannotListen(host, port, _reason(e)) from None
    bound: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as e:
        for sock in bound:
            sock.close()
        raise CannotListen(host, port, _reason(e)) from None
    return bound


def listen_failure(host: str, port: int, error: OSError) -> CannotListen:
    """The error for a socket whose `listen()` failed (another process bound the same
    port with SO_REUSEADDR and listened first)."""
    return CannotListen(host, port, _reason(error))


def _reason(error: OSError) -> str:
    """ "address already in use", as the C library says it, in lower case."""
    text = error.strerror or str(error) or type(error).__name__
    return text[:1].lower() + text[1:]


def listening_url(host: str, port: int, tls: bool) -> str:
    """The URL clients reach the router at (an IPv6 host in brackets)."""
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"
