"""Configuration: defaults, errors that name the key, and `narwhal check-config`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from narwhal.config import ConfigError, parse_config

MINIMAL = "model: m\nengines: []\n"


def test_defaults_for_every_optional_key() -> None:
    config = parse_config(MINIMAL)
    assert config.serving.port == 8000
    assert config.serving.max_request_bytes == 1_048_576
    assert config.admission.mode == "predictive"
    assert config.admission.phase_concurrency.prefill == 64
    assert config.fleet.max_attempts == 2
    assert config.ha.backend == "none"
    assert config.tokenizer is None


def test_engines_and_fractional_durations() -> None:
    config = parse_config(
        "model: m\n"
        "engines:\n"
        "  - {name: p0, url: 'http://127.0.0.1:8101', role: prefill, wave: 1}\n"
        "  - {name: d0, url: 'http://127.0.0.1:8201', role: decode, dialect: sglang,\n"
        "     phase_concurrency: {decode: 8}}\n"
        "admission: {wait_timeout_s: 0.25, ttft_target_s: 0.5}\n"
        "serving: {request_timeout_s: 600}\n"
    )
    assert [e.role for e in config.engines] == ["prefill", "decode"]
    assert config.engines[1].phase_concurrency.decode == 8
    assert config.engines[1].phase_concurrency.prefill is None
    assert config.admission.wait_timeout_s == 0.25
    assert config.serving.request_timeout_s == 600.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            MINIMAL + "admission:\n  queue_limit: ten\n",
            'admission.queue_limit: expected int >= 0, got "ten"',
        ),
        (
            MINIMAL + "admission:\n  queue_limit: -1\n",
            "admission.queue_limit: expected int >= 0, got -1",
        ),
        (MINIMAL + "admision: {}\n", "admision: unknown key"),
        (MINIMAL + "serving: {prot: 1}\n", "serving.prot: unknown key"),
        ("engines: []\n", "model: required key missing"),
        ("model: m\n", "engines: required key missing"),
        (MINIMAL + "admission: {mode: closed}\n", "admission.mode: expected one of"),
        ("model: m\nengines: [{name: a, url: 'ftp://x'}]\n", "engines.0.url: expected an http"),
        (
            "model: m\nengines: [{name: a, url: 'http://x:1'}, {name: a, url: 'http://y:1'}]\n",
            "engines.1.name: duplicate",
        ),
        (
            "model: m\nengines: [{name: a, url: 'http://x:1', wave: one}]\n",
            'engines.0.wave: expected int >= 0 or null, got "one"',
        ),
        (
            "model: m\nengines: [{name: p, url: 'http://x:1', role: prefill}]\n",
            "prefill engines need at least one decode engine",
        ),
        (MINIMAL + "fleet: {probe_interval_s: 0}\n", "fleet.probe_interval_s: expected number > 0"),
        (MINIMAL + "fleet: {probe_interval_s: 2, stale_after_s: 1}\n", "fleet.stale_after_s"),
        (MINIMAL + "ha: {backend: etcd}\n", "ha.endpoints: required when ha.backend is etcd"),
        (
            MINIMAL + "ha: {backend: etcd, endpoints: ['127.0.0.1:2379']}\n",
            "ha.endpoints.0: expected an http:// or https:// URL",
        ),
        (
            MINIMAL + "ha: {backend: etcd, endpoints: ['http://e:2379'], lease_ttl_s: 1.5}\n",
            "ha.lease_ttl_s: expected int >= 1, got 1.5",
        ),
        (
            MINIMAL + "ha: {backend: etcd, endpoints: ['http://e:2379'], fence_margin_s: 3}\n",
            "ha.fence_margin_s: must be below ha.lease_ttl_s (3), got 3",
        ),
        (
            MINIMAL
            + "ha: {backend: etcd, endpoints: ['http://e:2379'], lease_ttl_s: 2,"
            + " renew_interval_s: 1.9}\n",
            "ha.renew_interval_s: must be below ha.lease_ttl_s - ha.fence_margin_s (1.8 s)",
        ),
        (MINIMAL + "ha: {key: ''}\n", "ha.key: expected string of at least 1 chars"),
        (
            MINIMAL + "fleet: {max_event_bytes: 100}\n",
            "fleet.max_event_bytes: expected int >= 4096 or null, got 100",
        ),
        (
            MINIMAL + "fleet: {max_response_bytes: 1.5}\n",
            "fleet.max_response_bytes: expected int >= 4096 or null, got 1.5",
        ),
        ("- a\n- b\n", "must be a mapping"),
        ("model: [\n", "invalid YAML"),
    ],
)
def test_errors_name_the_key_and_the_reason(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert message in str(info.value)


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "narwhal", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_exits_2_naming_the_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "admission:\n  queue_limit: ten\n")
    result = _check_config(bad)
    assert result.returncode == 2
    assert 'admission.queue_limit: expected int >= 0, got "ten"' in result.stderr


def test_check_config_prints_the_effective_configuration(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL + "admission: {queue_limit: 10}\n")
    result = _check_config(good)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["admission"]["queue_limit"] == 10
    assert effective["admission"]["wait_timeout_s"] == 30.0  # a default, made explicit
    assert effective["serving"]["max_retained"] == 4096


def test_check_config_shows_the_high_availability_timings_it_derived(tmp_path: Path) -> None:
    good = tmp_path / "ha.yaml"
    good.write_text(MINIMAL + "ha: {backend: etcd, endpoints: ['http://e:2379'], lease_ttl_s: 6}\n")
    result = _check_config(good)
    assert result.returncode == 0, result.stderr
    ha = yaml.safe_load(result.stdout)["ha"]
    assert (ha["renew_interval_s"], ha["fence_margin_s"]) == (2.0, pytest.approx(0.6))
    reread = parse_config(result.stdout).ha  # the printed configuration means the same
    assert (reread.renew_interval, reread.margin) == (2.0, pytest.approx(0.6))


def test_check_config_missing_file(tmp_path: Path) -> None:
    result = _check_config(tmp_path / "absent.yaml")
    assert result.returncode == 2
    assert "cannot read" in result.stderr


def test_high_availability_defaults_follow_the_lease_ttl() -> None:
    ha = parse_config(MINIMAL + "ha: {backend: etcd, endpoints: ['http://e:2379']}\n").ha
    assert (ha.lease_ttl_s, ha.renew_interval, ha.margin) == (3, 1.0, pytest.approx(0.3))
    ha = parse_config(
        MINIMAL + "ha: {backend: etcd, endpoints: ['http://e:2379'], lease_ttl_s: 1}\n"
    ).ha
    assert (ha.renew_interval, ha.margin) == (0.6, 0.1)


def test_the_event_limit_follows_the_request_limit_unless_set() -> None:
    """vLLM's first chunk carries the prompt's token IDs: the default grows with the
    largest request (8 bytes a byte of it), never below 8 MiB."""
    assert parse_config(MINIMAL).max_event_bytes == 8 << 20
    bigger = parse_config(MINIMAL + "serving: {max_request_bytes: 4194304}\n")
    assert bigger.max_event_bytes == 32 << 20
    chosen = parse_config(MINIMAL + "fleet: {max_event_bytes: 65536}\n")
    assert chosen.max_event_bytes == 65536


def test_the_response_limit_holds_two_largest_events_unless_set() -> None:
    assert parse_config(MINIMAL).max_response_bytes == 64 << 20
    bigger = parse_config(MINIMAL + "serving: {max_request_bytes: 8388608}\n")
    assert (bigger.max_event_bytes, bigger.max_response_bytes) == (64 << 20, 128 << 20)
    events = parse_config(MINIMAL + "fleet: {max_event_bytes: 67108864}\n")
    assert events.max_response_bytes == 128 << 20
    chosen = parse_config(MINIMAL + "fleet: {max_response_bytes: 1048576}\n")
    assert (chosen.max_event_bytes, chosen.max_response_bytes) == (8 << 20, 1 << 20)


def test_check_config_shows_the_limits_it_derived(tmp_path: Path) -> None:
    good = tmp_path / "limits.yaml"
    good.write_text(MINIMAL + "serving: {max_request_bytes: 2097152}\n")
    result = _check_config(good)
    assert result.returncode == 0, result.stderr
    fleet = yaml.safe_load(result.stdout)["fleet"]
    assert (fleet["max_event_bytes"], fleet["max_response_bytes"]) == (16 << 20, 64 << 20)
    reread = parse_config(result.stdout)  # the printed configuration means the same
    assert (reread.max_event_bytes, reread.max_response_bytes) == (16 << 20, 64 << 20)
