"""HTTPS to clients: the server's TLS context from `serving.tls_cert` and `serving.tls_key`.

Both are PEM files read once at start-up: the certificate chain (the server's certificate
first, then any intermediates) and its unencrypted private key (an encrypted one would
make OpenSSL ask for a passphrase on the terminal; it is refused instead). What cannot be
loaded is a ConfigError naming the key, so `narwhal serve` and `narwhal check-config` say
what is wrong with which file and exit 2.
"""

from __future__ import annotations

import ssl

from narwhal.config import ConfigError, ServingConfig


def server_tls_context(serving: ServingConfig) -> ssl.SSLContext | None:
    """The context to serve HTTPS with, or None for plain HTTP (neither key set)."""
    if serving.tls_cert is None or serving.tls_key is None:
        return None  # config validation refuses one without the other
    problems = [
        problem
        for problem in (
            _pem_problem("serving.tls_cert", serving.tls_cert, "CERTIFICATE-----"),
            _pem_problem("serving.tls_key", serving.tls_key, "PRIVATE KEY-----"),
        )
        if problem is not None
    ]
    if problems:
        raise ConfigError(*problems)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        # An empty password: an encrypted key fails here rather than prompting.
        context.load_cert_chain(serving.tls_cert, serving.tls_key, password=b"")
    except ssl.SSLError as e:
        raise ConfigError(
            f"serving.tls_key: {serving.tls_key} cannot be used with {serving.tls_cert} "
            f"(not its unencrypted private key?): {e.reason or e}"
        ) from None
    except OSError as e:
        raise ConfigError(f"serving.tls_cert: cannot load: {e.strerror or e}") from None
    return context


def _pem_problem(key: str, path: str, marker: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as e:
        return f"{key}: cannot read {path}: {e.strerror or e}"
    if marker not in text:
        kind = "certificate" if marker.startswith("CERT") else "private key"
        return f"{key}: {path} holds no PEM {kind}"
    return None
