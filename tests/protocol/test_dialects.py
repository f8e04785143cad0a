"""The dialect names are declared once (`narwhal.protocol.dialects`), the configuration
and the simulator accept exactly those, and each has one consistent capabilities record."""

from __future__ import annotations

import argparse
from typing import get_args

import pytest

from narwhal.config import ConfigError, config_from_mapping
from narwhal.protocol.dialects import (
    ROUTES,
    VLLM_ONLY_FIELDS,
    Dialect,
    capabilities,
)
from narwhal.protocol.events import Route
from narwhal.sim.cli import add_arguments

DIALECTS = get_args(Dialect)


def engine_config(dialect: str) -> dict[str, object]:
    return {"model": "m", "engines": [{"name": "e0", "url": "http://e0", "dialect": dialect}]}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_configuration_takes_every_dialect(dialect: str) -> None:
    assert config_from_mapping(engine_config(dialect)).engines[0].dialect == dialect


def test_the_configuration_names_the_dialects_it_takes() -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_mapping(engine_config("tgi"))
    assert all(f'"{name}"' in str(refused.value) for name in DIALECTS)


def test_the_simulator_offers_every_dialect() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (flag,) = [a for a in parser._actions if "--dialect" in a.option_strings]
    assert tuple(flag.choices or ()) == DIALECTS


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_has_a_consistent_record(dialect: Dialect) -> None:
    engine = capabilities(dialect)
    assert engine.name == dialect
    assert engine.token_ids_on <= ROUTES and engine.sglext_ids_on <= ROUTES
    # A route's IDs come per event or at the end, never both.
    assert not engine.token_ids_on & engine.sglext_ids_on
    assert engine.vllm_fields <= set(VLLM_ONLY_FIELDS)
    # IDs are asked with return_token_ids, so a dialect that gives them takes the field.
    assert not engine.token_ids_on or "return_token_ids" in engine.vllm_fields


def test_routes_are_the_route_literal() -> None:
    assert set(get_args(Route)) == ROUTES


@pytest.mark.parametrize(
    ("dialect", "route", "supplied"),
    [
        ("vllm", "chat", True),
        ("vllm", "completion", True),
        # SGLang streams a chat's IDs only at the end (PROTOCOL.md §6.1).
        ("sglang", "chat", False),
        ("sglang", "completion", True),
        ("openai", "chat", False),
        ("openai", "completion", False),
    ],
)
def test_who_gives_per_event_token_ids(dialect: Dialect, route: Route, supplied: bool) -> None:
    assert (route in capabilities(dialect).token_ids_on) is supplied


def test_null_fields_as_each_engine_writes_them() -> None:
    assert [d for d in DIALECTS if capabilities(d).null_usage] == ["sglang"]
    assert [d for d in DIALECTS if capabilities(d).null_ids] == ["vllm"]
    assert [d for d in DIALECTS if capabilities(d).metrics_optional] == ["openai"]
    assert [d for d in DIALECTS if capabilities(d).version_gates_token_ids] == ["vllm"]


def test_token_accounting_is_token_ids_only_where_every_route_has_them() -> None:
    """What /admin/engines reports: SGLang has per-event IDs on one route only, so its
    accounting is not by IDs throughout."""
    assert {d: capabilities(d).token_accounting for d in DIALECTS} == {
        "vllm": "token_ids",
        "sglang": "unavailable",
        "openai": "unavailable",
    }
