"""Running what the decision core decides: the attempt runner and its asyncio shell.

    attempts.py       `Dispatcher`: a request's attempts on the engines its placement
                      names (prefill half, decode stream, first events, retries)
    gate.py           `AdmissionGate`: the core's asyncio shell (waits with deadlines,
                      wakeups, the output reported in batches)
    context_check.py  the context-length 400, before any engine work

Every decision is the core's (`narwhal.decision`), asked in values keyed by request id;
nothing here decides who is admitted or where a request runs.
"""

from narwhal.dispatch.attempts import Dispatcher

__all__ = ["Dispatcher"]
