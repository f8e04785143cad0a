"""What stops `narwhal serve` from starting is said in one line, and the exit status is 2:
never a traceback, and nothing left open behind it (no "Unclosed client session")."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # ResourceWarnings shown: a session or socket left unclosed would print one.
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-m", "narwhal", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port some other server listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def write_config(path: Path, **sections: object) -> Path:
    config: dict[str, object] = {
        "model": "m",
        "engines": [{"name": "e0", "url": "http://127.0.0.1:9"}],
        "serving": {"host": "127.0.0.1", "port": 0},
    }
    config.update(sections)
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path, busy_port: int) -> None:
    config = write_config(tmp_path / "c.yaml", serving={"host": "127.0.0.1", "port": busy_port})
    result = serve("--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"
    ]
    assert result.stdout == ""


def test_the_embedded_default_on_a_port_in_use_closes_its_engines(busy_port: int) -> None:
    """The embedded engines were started before the router tried to listen: they and every
    client session are closed before the process exits."""
    result = serve("--port", str(busy_port))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"
    ]


def test_an_address_this_host_does_not_have(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml")
    result = serve("--config", str(config), "--host", "192.0.2.1")  # TEST-NET-1
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: cannot listen on 192.0.2.1:0: cannot assign requested address"
    ]


def test_a_missing_configuration_file(tmp_path: Path) -> None:
    result = serve("--config", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'absent.yaml'}: cannot read: No such file or directory"
    ]


def test_an_unreadable_tokenizer(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    config = write_config(tmp_path / "c.yaml", tokenizer=str(tokenizer))
    result = serve("--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: tokenizer: cannot read {tokenizer}: No such file or directory"
    ]


def test_a_certificate_that_cannot_be_loaded(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\nnonsense\n")
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nnonsense\n")
    config = write_config(
        tmp_path / "c.yaml",
        serving={
            "port": 0,
            "tls_cert": str(tmp_path / "cert.pem"),
            "tls_key": str(tmp_path / "key.pem"),
        },
    )
    result = serve("--config", str(config))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: serving.tls_key: {tmp_path / 'key.pem'} cannot be used with")


def test_every_configuration_problem_is_listed(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        engines=[{"name": "a", "url": "http://h:1"}, {"name": "a", "url": "http://h:1"}],
        admission={"queue_limit": "ten"},
    )
    result = serve("--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        'error: admission.queue_limit: expected int >= 0, got "ten"',
        'error: engines.1.name: duplicate engine name "a" (engines.0, a, has it)',
        'error: engines.1.url: duplicate engine url "http://h:1" (engines.0, a, has it)',
    ]


def test_a_secret_that_is_not_in_the_environment(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        engines=[{"name": "e0", "url": "http://127.0.0.1:9", "api_key_env": "NARWHAL_TEST_KEY"}],
    )
    result = serve("--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: engines.0.api_key_env: environment variable NARWHAL_TEST_KEY is not set"
    ]
