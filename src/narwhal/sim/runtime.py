"""The parts of one running sim, built once and passed to every route (no globals)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import aiohttp

from narwhal.sim.engine import Engine
from narwhal.sim.kv import KvStore
from narwhal.sim.metrics import SimMetrics, cache_config_labels
from narwhal.sim.options import SimOptions
from narwhal.sim.shapes_openai import OpenAIShape
from narwhal.sim.shapes_sglang import SglangShape
from narwhal.sim.shapes_vllm import VllmShape

SHAPES: dict[str, type[VllmShape]] = {
    "vllm": VllmShape,
    "sglang": SglangShape,
    "openai": OpenAIShape,
}
VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}


@dataclass(slots=True)
class SimRuntime:
    options: SimOptions
    engine: Engine
    metrics: SimMetrics
    kv_store: KvStore
    session: aiohttp.ClientSession
    shape_class: type[VllmShape]
    engine_id: str
    started: int = field(default_factory=lambda: int(time.time()))
    advertised_host: str = "127.0.0.1"  # what prefill engines put in remote_host
    port: int = 0

    @classmethod
    def create(cls, options: SimOptions) -> SimRuntime:
        """Build the parts; must run inside the event loop that will serve them."""
        engine = Engine(options)
        metrics = SimMetrics(options.model, options.dialect, engine.gauges,
                             engine.scheduler.counters, cache_config_labels(options))  # fmt: skip
        engine.metrics = metrics
        engine_id = str(uuid.uuid4())
        return cls(
            options=options,
            engine=engine,
            metrics=metrics,
            kv_store=KvStore(engine, options.kv_hold_s, engine_id),
            session=aiohttp.ClientSession(),
            shape_class=SHAPES[options.dialect],
            engine_id=engine_id,
        )

    async def close(self) -> None:
        self.kv_store.close()
        await self.engine.close()
        await self.session.close()
