"""The seam between the HTTP front and the rest of the router.

The front parses, validates and counts; a `CompletionService` takes a validated request
through admission, placement and the engine, and writes the response. The front never
makes admission or placement decisions, and the service never parses client bodies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from narwhal.errors import Outcome
from narwhal.protocol.requests import CompletionRequest


@dataclass(slots=True)
class RequestContext:
    request_id: str
    arrived: float  # time.monotonic() when the request arrived
    deadline: float  # time.monotonic() by which it must be done
    prompt_tokens: int  # workload sizing


class CompletionService(Protocol):
    async def serve(
        self, request: CompletionRequest, context: RequestContext, http: web.Request
    ) -> tuple[web.StreamResponse, Outcome]:
        """Serve one request; return the response and its terminal outcome.

        Before response headers, failures are raised as NarwhalError (the front renders
        them with their status); after headers the service ends the stream itself and
        reports the outcome (`client_gone` when the client left while it was written;
        a disconnect may also cancel the task).
        """
        ...

    def readiness(self) -> str | None:
        """None when requests can be placed, else the reason /ready reports."""
        ...
