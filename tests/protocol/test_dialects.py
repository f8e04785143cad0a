"""The dialect names are declared once (`narwhal.protocol.dialects`), and the
configuration and the simulator accept exactly those."""

from __future__ import annotations

import argparse
from typing import get_args

import pytest

from narwhal.config import ConfigError, config_from_mapping
from narwhal.protocol.dialects import Dialect
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
