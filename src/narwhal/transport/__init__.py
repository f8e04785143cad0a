"""The decision core behind a socket: one decision process, several relay workers (Step 16).

`CoreServer` (the decision process) serves a `DecisionCore` on a Unix socket; each relay
worker speaks to it through a `RemoteCore`, an `AsyncDecisionCore` for its gate. What
crosses is the core's own vocabulary (`narwhal.decision.messages`), framed
(`frames.py`); nothing crosses per stream event.
"""
