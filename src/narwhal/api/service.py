"""The seam between the HTTP front and the rest of the router.

The front parses, validates, sizes and counts, and writes every response; a
`CompletionService` takes a validated request through admission, placement and the
engine and hands back what to write: an `Assembled` body, or a `StreamLease` whose first
events are in hand. The front never makes admission or placement decisions, and the
service never touches HTTP.
"""

from __future__ import annotations

from typing import Protocol

from narwhal.lease import Assembled, RequestContext, StreamLease, Tenancy
from narwhal.protocol.requests import CompletionRequest


class CompletionService(Protocol):
    async def serve(
        self, request: CompletionRequest, context: RequestContext
    ) -> Assembled | StreamLease:
        """Serve one request up to its first events (streaming) or its whole answer.

        Before response headers, failures are raised as NarwhalError (the front renders
        them with their status). A `StreamLease` must be finished by the caller, once,
        whatever happens while it is relayed.
        """
        ...

    def readiness(self) -> str | None:
        """None when requests can be placed, else the reason /ready reports."""
        ...


__all__ = ["Assembled", "CompletionService", "RequestContext", "StreamLease", "Tenancy"]
