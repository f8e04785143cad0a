"""Configuration: defaults, errors that name the key, and `narwhal check-config`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from narwhal.config import ConfigError, TracingConfig, parse_config, read_config, resolve_secrets

MINIMAL = "model: m\nengines: [{name: e0, url: 'http://127.0.0.1:8100'}]\n"


def test_defaults_for_every_optional_key() -> None:
    config = parse_config(MINIMAL)
    assert config.serving.port == 8000
    assert config.serving.max_request_bytes == 1_048_576
    assert config.admission.mode == "predictive"
    assert config.admission.phase_concurrency.prefill == 64
    assert config.fleet.max_attempts == 2
    assert config.fleet.probe_prompt_tokens is None  # the default sizes, fitted
    assert config.ha.backend == "none"
    assert config.tokenizer is None
    assert (config.serving.shutdown_delay_s, config.serving.drain_timeout_s) == (5.0, 30.0)


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
            MINIMAL + "ha: {kubernetes_label: {key: 'Narwhal Leader'}}\n",
            'ha.kubernetes_label.key: "Narwhal Leader" is not a label key: the name',
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {key: 'Narwhal.io/leader'}}\n",
            "the prefix (before /) must be a DNS subdomain",
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {key: 'a/b/c'}}\n",
            "at most one '/', between a prefix and a name",
        ),
        (
            MINIMAL + f"ha: {{kubernetes_label: {{key: 'narwhal.io/{'x' * 64}'}}}}\n",
            "the name (after any prefix/) must be at most 63 characters",
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {key: 'kubernetes.io/leader'}}\n",
            "the prefix kubernetes.io/ is reserved",
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {value: true}}\n",
            "ha.kubernetes_label.value: expected string, got true",  # YAML's true: quote it
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {value: 'yes please'}}\n",
            'ha.kubernetes_label.value: "yes please" is not a label value',
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {pod_name_env: 'POD NAME'}}\n",
            'ha.kubernetes_label.pod_name_env: "POD NAME" is not an environment variable',
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {deletion_cost: 2147483648}}\n",
            "ha.kubernetes_label.deletion_cost: expected int >= -2147483648 and <= 2147483647",
        ),
        (
            MINIMAL + "ha: {kubernetes_label: {name: leader}}\n",
            "ha.kubernetes_label.name: unknown key",
        ),
        (
            MINIMAL + "fleet: {max_event_bytes: 100}\n",
            "fleet.max_event_bytes: expected int >= 4096 or null, got 100",
        ),
        (
            MINIMAL + "fleet: {max_response_bytes: 1.5}\n",
            "fleet.max_response_bytes: expected int >= 4096 or null, got 1.5",
        ),
        (
            MINIMAL + "serving: {shutdown_delay_s: -1}\n",
            "serving.shutdown_delay_s: expected number >= 0",
        ),
        (
            MINIMAL + "serving: {drain_timeout_s: 0}\n",
            "serving.drain_timeout_s: expected number > 0",
        ),
        (
            MINIMAL + "fleet: {probe_prompt_tokens: [512, 512]}\n",
            "fleet.probe_prompt_tokens: must hold at least two different lengths",
        ),
        (
            MINIMAL + "fleet: {probe_prompt_tokens: [0, 512]}\n",
            "fleet.probe_prompt_tokens.0: expected int >= 1",
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


def test_the_kubernetes_label_is_off_by_default_and_its_keys_default_for_a_pod() -> None:
    assert parse_config(MINIMAL).ha.kubernetes_label is None
    label = parse_config(MINIMAL + "ha: {kubernetes_label: {}}\n").ha.kubernetes_label
    assert label is not None
    assert (label.key, label.value, label.pod_name_env) == ("narwhal.io/leader", "true", "POD_NAME")
    assert label.deletion_cost == 1000
    assert label.service_account_dir == "/var/run/secrets/kubernetes.io/serviceaccount"
    # Keys Kubernetes accepts: a bare name, a dotted prefix, an empty value.
    for key in ("leader", "team-a.example.com/narwhal_leader", "app.kubernetes.io/leader"):
        text = MINIMAL + f"ha: {{kubernetes_label: {{key: '{key}', value: ''}}}}\n"
        assert parse_config(text).ha.kubernetes_label is not None


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


# --- every problem at once ------------------------------------------------------------------


def _problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return info.value.problems


def test_every_problem_in_the_file_is_reported_not_only_the_first() -> None:
    problems = _problems(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://h:1', wave: one}\n"
        "  - {name: b, url: 'ftp://h:2', colour: red}\n"
        "serving: {port: x}\n"
        "admission: {queue_limit: -1, mode: closed}\n"
        "fleet: {probe_interval_s: 2, stale_after_s: 1}\n"
        "extra: 1\n"
    )
    assert problems == (
        'engines.0.wave: expected int >= 0 or null, got "one"',
        "engines.1.colour: unknown key (expected one of: " + ", ".join(ENGINE_KEYS) + ")",
        'serving.port: expected int >= 0 and <= 65535, got "x"',
        "admission.queue_limit: expected int >= 0, got -1",
        'admission.mode: expected one of "open", "predictive", got "closed"',
        "extra: unknown key (expected one of: " + ", ".join(CONFIG_KEYS) + ")",
        "fleet.stale_after_s: must be at least fleet.probe_interval_s (2.0), got 1.0",
        # (the engine's other problem does not hide its URL's)
        'engines.1.url: expected an http:// or https:// URL, got "ftp://h:2"',
    )


def test_an_engine_url_ending_in_v1_is_refused_with_its_base_named() -> None:
    """The OpenAI client habit (base_url ".../v1") would send /v1/v1/chat/completions."""
    problems = _problems(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://10.0.0.1:8000/v1'}\n"
        "  - {name: b, url: 'https://gpu.example/serving/v1/'}\n"
        "  - {name: c, url: 'http://10.0.0.3:8000/proxy'}\n"  # a path prefix is fine
    )
    assert problems == (
        "engines.0.url: ends in /v1, which Narwhal adds itself (and /health, /metrics, "
        '/tokenize beside it): give the engine\'s base URL, "http://10.0.0.1:8000"',
        "engines.1.url: ends in /v1, which Narwhal adds itself (and /health, /metrics, "
        '/tokenize beside it): give the engine\'s base URL, "https://gpu.example/serving"',
    )


def test_a_generic_server_cannot_be_half_of_a_disaggregated_pair() -> None:
    """The prefill/decode handshake is vLLM's `kv_transfer_params` (SGLang takes it too):
    an `openai` engine would be sent a field it refuses, on every request."""
    problems = _problems(
        "model: m\n"
        "engines:\n"
        "  - {name: p, url: 'http://h:1', dialect: openai, role: prefill}\n"
        "  - {name: d, url: 'http://h:2', dialect: sglang, role: decode}\n"
        "  - {name: o, url: 'http://h:3', dialect: openai}\n"
    )
    assert problems == (
        "engines.0.role: a prefill engine takes the prefill/decode handshake "
        "(kv_transfer_params: dialect vllm or sglang), which dialect openai has not; "
        "give it role both",
    )


def test_a_misspelt_key_gets_the_key_it_is_closest_to() -> None:
    (problem,) = _problems(
        "model: m\nengines: [{name: a, url: 'http://h:1'}]\nserving: {max_retaned: 5}\n"
    )
    assert problem.startswith('serving.max_retaned: unknown key (did you mean "max_retained"? ')
    (far,) = _problems("model: m\nengines: [{name: a, url: 'http://h:1'}]\ncolour: red\n")
    assert "did you mean" not in far


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    path.write_text("model: m\nengines:\n  - {name: a, url: 'http://h:1'\n")
    with pytest.raises(ConfigError) as error:
        read_config(str(path))
    (problem,) = error.value.problems
    assert problem.startswith(f"{path}:4:1: invalid YAML: expected ',' or '}}'"), problem
    assert "(while parsing a flow mapping at line 3, column 5)" in problem


ENGINE_KEYS = [
    "name", "url", "dialect", "role", "wave", "phase_concurrency", "max_num_batched_tokens",
    "max_num_seqs", "scheduling_policy", "api_key", "api_key_env", "api_key_file",
    "forward_client_authorization",
]  # fmt: skip
CONFIG_KEYS = [
    "model",
    "engines",
    "serving",
    "admission",
    "tokenizer",
    "fleet",
    "ha",
    "logging",
    "tracing",
    "tenants",
]


def test_a_section_with_a_type_error_still_gets_the_other_sections_checked() -> None:
    """The checks of a badly typed section wait for it to be typed right; the others run."""
    problems = _problems(
        "model: m\n"
        "engines: [{name: a, url: 'http://h:1'}, {name: a, url: 'http://h:2'}]\n"
        "fleet: {probe_interval_s: 2, stale_after_s: 1, max_attempts: zero}\n"
        "ha: {backend: etcd}\n"
    )
    assert problems == (
        'fleet.max_attempts: expected int >= 1, got "zero"',
        "ha.endpoints: required when ha.backend is etcd",
        'engines.1.name: duplicate engine name "a" (engines.0, a, has it)',
    )


@pytest.mark.parametrize(
    ("engines", "problem"),
    [
        ("[]", "engines: at least one engine is required"),
        (
            "[{name: a, url: 'http://h:1'}, {name: a, url: 'http://h:2'}]",
            'engines.1.name: duplicate engine name "a" (engines.0, a, has it)',
        ),
        # One engine however its URL is written: case, default port, trailing slash.
        (
            "[{name: a, url: 'http://h:80'}, {name: b, url: 'HTTP://H/'}]",
            'engines.1.url: duplicate engine url "HTTP://H/" (engines.0, a, has it)',
        ),
        (
            "[{name: a, url: 'https://h'}, {name: b, url: 'https://h:443'}]",
            'engines.1.url: duplicate engine url "https://h:443" (engines.0, a, has it)',
        ),
    ],
)
def test_an_empty_fleet_and_duplicate_engines_are_refused(engines: str, problem: str) -> None:
    assert _problems(f"model: m\nengines: {engines}\n") == (problem,)


def test_the_same_host_on_other_ports_or_paths_is_other_engines() -> None:
    config = parse_config(
        "model: m\nengines:\n"
        "  - {name: a, url: 'http://h:1'}\n"
        "  - {name: b, url: 'http://h:2'}\n"
        "  - {name: c, url: 'http://h:1/other'}\n"
    )
    assert [e.name for e in config.engines] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("serving", "problem"),
    [
        (
            "{admin_token: a, admin_token_env: B}",
            "serving.admin_token_env: give only one of admin_token, admin_token_env",
        ),
        (
            "{admin_token_env: B, admin_token_file: /c}",
            "serving.admin_token_file: give only one of admin_token_env, admin_token_file",
        ),
        (
            "{admin_token: 'two words'}",
            "serving.admin_token: must be printable ASCII without spaces",
        ),
        ("{api_keys: [ok, 'bad key']}", "serving.api_keys.1: must be printable ASCII"),
        ("{api_keys: ['']}", "serving.api_keys.0: expected string of at least 1 chars"),
        ("{tls_cert: /c.pem}", "serving.tls_key: required with serving.tls_cert (HTTPS)"),
        ("{tls_key: /k.pem}", "serving.tls_cert: required with serving.tls_key (HTTPS)"),
    ],
)
def test_secret_and_tls_keys_are_checked(serving: str, problem: str) -> None:
    (found,) = _problems(MINIMAL + f"serving: {serving}\n")
    assert found.startswith(problem), found


def test_an_engine_key_has_one_source() -> None:
    (found,) = _problems(
        "model: m\nengines: [{name: a, url: 'http://h:1', api_key: k, api_key_file: /f}]\n"
    )
    assert found == "engines.0.api_key_file: give only one of api_key, api_key_file"


# --- secrets named by the configuration ------------------------------------------------------


def test_secrets_are_read_from_environment_variables_and_files(tmp_path: Path) -> None:
    (tmp_path / "admin").write_text("admin-from-file\n")  # as `echo` leaves it
    (tmp_path / "keys").write_text("# client keys\nkey-one\n\n  key-two  \nkey-one\n")
    config = resolve_secrets(
        parse_config(
            "model: m\n"
            "engines:\n"
            "  - {name: a, url: 'http://h:1', api_key_env: ENGINE_A_KEY}\n"
            f"  - {{name: b, url: 'http://h:2', api_key_file: {tmp_path / 'admin'}}}\n"
            "  - {name: c, url: 'http://h:3', api_key: inline-key}\n"
            "  - {name: d, url: 'http://h:4'}\n"
            f"serving: {{admin_token_file: {tmp_path / 'admin'}, api_keys: [inline],"
            f" api_keys_file: {tmp_path / 'keys'}}}\n"
        ),
        {"ENGINE_A_KEY": "from-env"},
    )
    assert config.serving.admin_token == "admin-from-file"
    assert config.serving.api_keys == ("inline", "key-one", "key-two")
    keys = [e.api_key for e in config.engines]
    assert keys == ["from-env", "admin-from-file", "inline-key", None]
    assert [e.authorization for e in config.engines] == [
        "Bearer from-env", "Bearer admin-from-file", "Bearer inline-key", None,
    ]  # fmt: skip
    # Read once: the sources are cleared, so resolving again changes nothing.
    assert (config.serving.admin_token_file, config.engines[0].api_key_env) == (None, None)
    assert resolve_secrets(config, {}) == config


def test_every_secret_that_cannot_be_read_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "comments").write_text("# nothing but comments\n\n")
    (tmp_path / "spaced").write_text("two words\n")
    config = parse_config(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://h:1', api_key_env: UNSET_KEY}\n"
        "  - {name: b, url: 'http://h:2', api_key_env: EMPTY_KEY}\n"
        f"  - {{name: c, url: 'http://h:3', api_key_file: {tmp_path / 'spaced'}}}\n"
        f"serving: {{admin_token_file: {tmp_path / 'absent'},"
        f" api_keys_file: {tmp_path / 'comments'}}}\n"
    )
    with pytest.raises(ConfigError) as info:
        resolve_secrets(config, {"EMPTY_KEY": " "})
    assert info.value.problems == (
        f"serving.admin_token_file: cannot read {tmp_path / 'absent'}: No such file or directory",
        f"serving.api_keys_file: {tmp_path / 'comments'} holds no keys",
        "engines.0.api_key_env: environment variable UNSET_KEY is not set",
        "engines.1.api_key_env: environment variable EMPTY_KEY is empty",
        f"engines.2.api_key_file: the secret in {tmp_path / 'spaced'} must be printable ASCII"
        " without spaces (it is sent as a bearer token)",
    )
    assert "two words" not in str(info.value)  # a secret is never quoted


def test_forwarding_the_client_authorization_is_set_for_the_fleet_or_per_engine() -> None:
    config = parse_config(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://h:1'}\n"
        "  - {name: b, url: 'http://h:2', forward_client_authorization: true}\n"
    )
    assert [config.forwards_client_authorization(e) for e in config.engines] == [False, True]
    config = parse_config(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://h:1'}\n"
        "  - {name: b, url: 'http://h:2', forward_client_authorization: false}\n"
        "fleet: {forward_client_authorization: true}\n"
    )
    assert [config.forwards_client_authorization(e) for e in config.engines] == [True, False]


# --- check-config -----------------------------------------------------------------------------


def test_check_config_lists_every_problem_one_a_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model: m\n"
        "engines: [{name: a, url: 'http://h:1'}, {name: a, url: 'http://h:1/'}]\n"
        "admission: {queue_limit: ten, wait_timeout_s: 0}\n"
    )
    result = _check_config(bad)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        'error: admission.queue_limit: expected int >= 0, got "ten"',
        "error: admission.wait_timeout_s: expected number > 0, got 0",
        'error: engines.1.name: duplicate engine name "a" (engines.0, a, has it)',
        'error: engines.1.url: duplicate engine url "http://h:1/" (engines.0, a, has it)',
    ]


def test_check_config_reports_what_the_router_could_not_load(tmp_path: Path) -> None:
    """Secrets, certificates and the tokenizer are checked as `narwhal serve` would load
    them, every problem at once."""
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: m\n"
        "engines: [{name: a, url: 'http://h:1', api_key_env: NARWHAL_TEST_UNSET}]\n"
        f"serving: {{admin_token_file: {tmp_path / 'absent'},"
        f" tls_cert: {tmp_path / 'cert.pem'}, tls_key: {tmp_path / 'key.pem'}}}\n"
        f"tokenizer: {tmp_path / 'tokenizer.json'}\n"
    )
    result = _check_config(config)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: serving.admin_token_file: cannot read {tmp_path / 'absent'}:"
        " No such file or directory",
        "error: engines.0.api_key_env: environment variable NARWHAL_TEST_UNSET is not set",
        f"error: serving.tls_cert: {tmp_path / 'cert.pem'} holds no PEM certificate",
        f"error: serving.tls_key: cannot read {tmp_path / 'key.pem'}: No such file or directory",
        f"error: tokenizer: cannot read {tmp_path / 'tokenizer.json'}: No such file or directory",
    ]


def test_check_config_never_prints_a_secret(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("file-key\n")
    good = tmp_path / "secrets.yaml"
    good.write_text(
        "model: m\n"
        "engines:\n"
        "  - {name: a, url: 'http://h:1', api_key: engine-secret}\n"
        "  - {name: b, url: 'http://h:2', api_key_env: HOME}\n"
        f"serving: {{admin_token: admin-secret, api_keys: [client-secret],"
        f" api_keys_file: {tmp_path / 'keys'}}}\n"
    )
    result = _check_config(good)
    assert result.returncode == 0, result.stderr
    for secret in ("engine-secret", "admin-secret", "client-secret", "file-key"):
        assert secret not in result.stdout
    effective = yaml.safe_load(result.stdout)
    assert effective["serving"]["admin_token"] == "<redacted>"
    assert effective["serving"]["api_keys"] == ["<redacted>"]
    assert effective["serving"]["api_keys_file"] == str(tmp_path / "keys")  # where, not what
    assert [e["api_key"] for e in effective["engines"]] == ["<redacted>", None]
    assert effective["engines"][1]["api_key_env"] == "HOME"


def test_logging_and_tracing_keys() -> None:
    config = parse_config(
        MINIMAL
        + "logging: {format: json, level: warning, access_log: false}\n"
        + "tracing: {otlp_endpoint: 'http://collector:4318', service_name: edge-1}\n"
    )
    assert (config.logging.format, config.logging.level) == ("json", "warning")
    assert config.logging.access_log is False
    assert config.tracing.traces_url == "http://collector:4318/v1/traces"
    assert config.tracing.service_name == "edge-1"
    default = parse_config(MINIMAL)
    assert (default.logging.format, default.logging.access_log) == ("text", True)
    assert default.tracing.traces_url is None


def test_an_otlp_endpoint_with_a_path_is_used_as_it_is() -> None:
    tracing = TracingConfig(otlp_endpoint="https://otel.example/custom/traces")
    assert tracing.traces_url == "https://otel.example/custom/traces"
    assert TracingConfig(otlp_endpoint="http://c:4318/").traces_url == "http://c:4318/v1/traces"


def test_logging_and_tracing_problems_name_their_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            MINIMAL + "logging: {format: xml}\ntracing: {otlp_endpoint: 'collector:4318'}\n"
        )
    assert caught.value.problems == (
        'logging.format: expected one of "json", "text", got "xml"',
        "tracing.otlp_endpoint: expected an http:// or https:// URL of an OTLP/HTTP collector, "
        'got "collector:4318"',
    )


def test_tenants_classes_and_tenant_keys_are_checked_against_each_other() -> None:
    problems = _problems(
        MINIMAL
        + "admission: {classes: [gold, silver], reserved_prefill: {bronze: 1}}\n"
        + "serving:\n"
        + "  api_keys: [{key: sk-a, tenant: team-a}, {key: sk-b, tenant: team-z}, {tenant: x}]\n"
        + "tenants:\n"
        + "  team-a: {max_class: silver, default_class: gold, weight: 0}\n"
        + "  team-b: {max_class: critical}\n"
    )
    # (The tenants' classes and the keys' tenants wait for the tenants to be typed right.)
    assert problems == (
        "tenants.team-a.weight: expected number > 0 and <= 1000000, got 0",
        'admission.reserved_prefill.bronze: "bronze" is not a class '
        "(admission.classes: gold, silver)",
        "serving.api_keys.2: give the key: one of key, key_env, key_file",
    )


def test_a_key_naming_an_undeclared_tenant_is_refused_and_a_tenant_keeps_to_the_classes() -> None:
    problems = _problems(
        MINIMAL
        + "serving: {api_keys: [{key_env: TEAM_KEY, tenant: team-z}]}\n"
        + "tenants: {team-a: {max_class: standard, default_class: critical}, "
        + "team-b: {max_class: gold}}\n"
    )
    assert problems == (
        "tenants.team-a.default_class: critical is above the tenant's max_class (standard)",
        'tenants.team-b.max_class: "gold" is not a class '
        "(admission.classes: critical, standard, sheddable)",
        'serving.api_keys.0.tenant: tenant "team-z" is not declared under tenants '
        "(declared: team-a, team-b)",
    )


def test_one_key_for_two_tenants_is_refused_once_the_secrets_are_read() -> None:
    config = parse_config(
        MINIMAL
        + "serving: {api_keys: [{key_env: A, tenant: a}, {key_env: B, tenant: b}, sk-same]}\n"
        + "tenants: {a: {}, b: {}}\n"
    )
    with pytest.raises(ConfigError) as info:
        resolve_secrets(config, {"A": "sk-same", "B": "sk-other"})
    assert info.value.problems == (
        "serving.api_keys.2: the same key as serving.api_keys.0, which is tenant a's, names "
        "tenant default: give each tenant keys of its own",
    )
    resolved = resolve_secrets(config, {"A": "sk-a", "B": "sk-b"})
    assert resolved.client_keys == (("sk-a", "a"), ("sk-b", "b"), ("sk-same", "default"))


def test_serving_workers_is_read_and_must_be_positive() -> None:
    """`serving.workers` (DESIGN.md, Step 16): relay worker processes, 1 by default."""
    assert parse_config(MINIMAL).serving.workers == 1
    assert parse_config(MINIMAL + "serving: {workers: 4}\n").serving.workers == 4
    with pytest.raises(ConfigError, match=r"serving\.workers"):
        parse_config(MINIMAL + "serving: {workers: 0}\n")
