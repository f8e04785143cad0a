"""Fixtures for the real-engine tier: the tiny model, one real vLLM for the whole session
(it takes 20-60 s to start, so every vLLM module shares it: they are one xdist group,
`VLLM_MARKS`, which one worker owns), and routers in front of it as real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import NarwhalProcess, router_process
from tests.real.engines import TEST_TIMEOUT_S, EngineProcess, built_model, vllm_engine

MODEL = "narwhal-tiny"
# The vLLM modules' `pytestmark`: under `--dist loadgroup` they run on one worker, in order,
# so the session's engines start once; pytest-timeout's limit covers a setup that starts one.
VLLM_MARKS = [pytest.mark.xdist_group("real-vllm"), pytest.mark.timeout(TEST_TIMEOUT_S)]
# The engine's context, as common on small GPUs: what the profile's probes must fit.
MAX_MODEL_LEN = 2048
# A second engine's longer context, for the predictive tests whose prompts are long (a
# prompt-alone refusal wants prompts the short context would turn away as too long).
LONG_MAX_MODEL_LEN = 8192


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return built_model()


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def vllm(model_dir: Path, engine_logs: Path) -> Iterator[EngineProcess]:
    with vllm_engine(
        model_dir, engine_logs, served_name=MODEL, core=0, max_model_len=MAX_MODEL_LEN
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def vllm_long(model_dir: Path, engine_logs: Path) -> Iterator[EngineProcess]:
    """A second real vLLM, on the other core, with a context of 8,192 tokens."""
    with vllm_engine(
        model_dir, engine_logs, served_name=MODEL, core=1, max_model_len=LONG_MAX_MODEL_LEN
    ) as engine:
        yield engine


def vllm_config(engine: EngineProcess, **sections: Any) -> dict[str, Any]:
    """A router for the real vLLM (dialect vllm), `admission: open` unless a section says."""
    config: dict[str, Any] = {
        "model": MODEL,
        "engines": [{"name": "v0", "url": engine.url, "dialect": "vllm", "role": "both"}],
        "admission": {"mode": "open"},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    return config


@pytest.fixture(scope="module")
def router(vllm: EngineProcess) -> Iterator[NarwhalProcess]:
    """An `admission: open` router in front of the real vLLM, shared by a module."""
    with router_process(vllm_config(vllm)) as process:
        yield process
