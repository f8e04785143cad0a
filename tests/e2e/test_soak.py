"""A bounded soak (30 s; NARWHAL_SOAK_S to change it): nothing lost, nothing leaked.

The traffic, faults and checks are in `tests/soak.py`; `scripts/perf/soak.py` runs the
same soak for 10 minutes and prints its report.
"""

from __future__ import annotations

import os

import pytest

from tests.soak import run_soak, soak_fleet

# Its leak checks count the loop's tasks and descriptors against the idle ones: beside the
# parallel tests and a real vLLM, a task still finishing reads as a leak.
pytestmark = pytest.mark.alone


async def test_mixed_traffic_with_hostile_clients_and_engine_restarts_leaks_nothing() -> None:
    duration = float(os.environ.get("NARWHAL_SOAK_S", "30"))
    with soak_fleet() as (router, sims):
        report = await run_soak(router, sims, duration)
    print(report.summary())
    assert report.restarts == 3
    assert report.client["served"] > 100
    report.check()
