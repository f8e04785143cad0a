"""What a reload would change, decided without a router: `config_changes.compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from narwhal.config import Config, ConfigError, config_from_mapping, load_config
from narwhal.ops.config_changes import compare
from narwhal.ops.reload import file_source


def config(**sections: Any) -> Config:
    raw: dict[str, Any] = {
        "model": "m",
        "engines": [
            {"name": "a", "url": "http://127.0.0.1:8101"},
            {"name": "b", "url": "http://127.0.0.1:8102", "wave": 1},
        ],
    }
    raw.update(sections)
    return config_from_mapping(raw)


def test_the_same_configuration_changes_nothing() -> None:
    changes = compare(config(), config())
    assert changes.restart == () and changes.described == () and not changes.engines


def test_live_settings_are_described_with_their_values() -> None:
    new = config(
        serving={"max_retained": 10, "drain_timeout_s": 5},
        admission={"queue_limit": 3, "phase_concurrency": {"prefill": 2}},
    )
    changes = compare(config(), new)
    assert changes.restart == ()
    assert set(changes.described) == {
        "serving.max_retained: 4096 -> 10",
        "serving.drain_timeout_s: 30.0 -> 5.0",
        "admission.queue_limit: 1024 -> 3",
        "admission.phase_concurrency.prefill: 64 -> 2",
    }


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"serving": {"port": 9000}}, "serving.port"),
        ({"serving": {"host": "0.0.0.0"}}, "serving.host"),
        ({"model": "other"}, "model"),
        ({"admission": {"mode": "open"}}, "admission.mode"),
        ({"fleet": {"policy": "round_robin"}}, "fleet.policy"),
        ({"fleet": {"prefix_index": {"block_chars": 32}}}, "fleet.prefix_index.block_chars"),
        ({"tokenizer": "/tmp/tokenizer.json"}, "tokenizer"),
        (
            {"ha": {"backend": "etcd", "endpoints": ["http://127.0.0.1:2379"]}},
            "ha.backend",
        ),
        # The label's task, its client and its pod are built at start.
        ({"ha": {"kubernetes_label": {}}}, "ha.kubernetes_label"),
    ],
)
def test_what_needs_a_restart_is_refused_by_key(sections: dict[str, Any], key: str) -> None:
    changes = compare(config(), config(**sections))
    assert changes.restart, changes
    assert changes.restart[0].startswith(f"{key}: cannot change while the router runs")
    assert f"restart to change {key}" in changes.restart[0]


def test_engines_added_removed_replaced_and_updated_by_name() -> None:
    new = config(
        engines=[
            # a: another URL is another engine under the old name
            {"name": "a", "url": "http://127.0.0.1:9101"},
            # b: its wave and its key change in place
            {"name": "b", "url": "http://127.0.0.1:8102", "wave": 2, "api_key": "sk-new"},
            {"name": "c", "url": "http://127.0.0.1:8103"},
        ]
    )
    running = config(
        engines=[
            {"name": "a", "url": "http://127.0.0.1:8101"},
            {"name": "b", "url": "http://127.0.0.1:8102", "wave": 1, "api_key": "sk-old"},
            {"name": "gone", "url": "http://127.0.0.1:8104"},
        ]
    )
    changes = compare(running, new)
    engines = changes.engines
    assert [e.name for e in engines.added] == ["c"]
    assert engines.removed == ("gone",)
    assert [e.url for e in engines.replaced] == ["http://127.0.0.1:9101"]
    assert [(e.name, e.wave) for e in engines.updated] == [("b", 2)]
    described = "\n".join(changes.described)
    assert "engine b: wave: 1 -> 2" in described
    assert "engine b: api_key changed" in described
    assert "sk-new" not in described and "sk-old" not in described  # secrets never shown
    assert "engine a replaced (url changed" in described
    assert "engine gone removed" in described


def test_tokens_are_said_to_change_never_shown() -> None:
    changes = compare(
        config(serving={"api_keys": ["k1"], "admin_token": "t1"}),
        config(serving={"api_keys": ["k2"], "admin_token": "t2"}),
    )
    assert set(changes.described) == {"serving.api_keys changed", "serving.admin_token changed"}


# --- a file with problems still names the restart-only keys it changes --------------------


def written(path: Path, **sections: Any) -> None:
    raw: dict[str, Any] = {"model": "m", "engines": [{"name": "a", "url": "http://127.0.0.1:8101"}]}
    raw.update(sections)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")


def refusal(path: Path, running: Config, flags: Any = lambda c: c) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        file_source(str(path), flags)(running)
    return caught.value.problems


def test_a_file_with_problems_also_names_each_restart_only_key_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    written(path)
    running = file_source(str(path), lambda c: c)(load_config(str(path)))
    written(
        path,
        serving={"port": 9999, "max_retained": "many"},  # restart-only beside a type error
        admission={"mode": "open"},
        fleet={"policy": "round_robin", "drain_timout_s": 1},  # unreadable: not compared
    )
    problems = refusal(path, running)
    keys = [p.split(":")[0] for p in problems]
    assert keys[-1] == "admission.mode"  # the file's own problems first, as check-config's
    assert set(keys[:-1]) == {"serving.max_retained", "fleet.drain_timout_s"}
    # serving cannot be read as a whole, so its port is not compared; fleet neither.
    assert not any(k in ("serving.port", "fleet.policy") for k in keys)


def test_the_command_lines_flags_apply_to_the_file_as_written(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.yaml"
    written(path, serving={"port": 8000})

    def port_flag(c: Config) -> Config:
        return msgspec.structs.replace(c, serving=msgspec.structs.replace(c.serving, port=0))

    running = file_source(str(path), port_flag)(load_config(str(path)))
    written(path, serving={"port": 8001}, tokenizer="/elsewhere", engines=[{"name": "a"}])
    problems = refusal(path, running, port_flag)
    assert [p.split(":")[0] for p in problems] == ["engines.0.url", "tokenizer"]
    # Without the flag the port the file gives is another one.
    problems = refusal(path, running)
    assert [p.split(":")[0] for p in problems][-2:] == ["serving.port", "tokenizer"]


def test_a_key_left_out_means_its_default_and_an_unparsable_file_compares_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "narwhal.yaml"
    written(path, admission={"mode": "open"})
    running = load_config(str(path))
    written(path, engines="none")  # admission left out: predictive, by default
    assert [p.split(":")[0] for p in refusal(path, running)][-1] == "admission.mode"
    path.write_text("model: [m\n", encoding="utf-8")
    assert all("cannot change" not in p for p in refusal(path, running))
