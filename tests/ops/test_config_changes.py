"""What a reload would change, decided without a router: `config_changes.compare`."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.config import Config, config_from_mapping
from narwhal.ops.config_changes import compare


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
