"""What a relay worker reads of the fleet without a round trip: the decision process's view.

The attempt runner asks the core a few read-only questions per request (whether the
router admits, the model's context length, an engine's capabilities, whether a first
attempt's engine has another to retry on) and the gauges read its counts. A worker
answers them from the last `FleetView` the decision process pushed: it pushes one on
every change, checked every `VIEW_EVERY_S`, and one to each worker as it connects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from narwhal.decision.core import AdmissionCounts, DecisionCore
from narwhal.protocol.dialects import DialectCapabilities

VIEW_EVERY_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class FleetView:
    readiness: str | None  # why the router does not admit, or None (`DecisionCore`)
    max_model_len: int | None
    capabilities: tuple[tuple[str, DialectCapabilities], ...]  # by engine name
    # Engines a first attempt could leave for another placement (`could_retry` with
    # nothing excluded yet: the first attempt is the only one whose timeout needs it).
    retry_elsewhere: frozenset[str]
    counts: AdmissionCounts

    def capabilities_of(self, engine: str) -> DialectCapabilities | None:
        for name, capabilities in self.capabilities:
            if name == engine:
                return capabilities
        return None


def view_of(core: DecisionCore, engines: Callable[[], Iterable[str]]) -> FleetView:
    """The core's answers now, for the engines `engines()` names."""
    names = tuple(engines())
    return FleetView(
        core.readiness(),
        core.max_model_len(),
        tuple((name, core.capabilities(name)) for name in names),
        frozenset(name for name in names if core.could_retry("", name)),
        core.counts(),
    )
