"""Observability: what the router tells operators about itself.

Logs and the access log (`logs`), the Prometheus metrics and their exposition
(`metrics`, `exposition`), the event loop's lag (`loop_monitor`), and tracing: the spans'
interface (`tracing`) and its OpenTelemetry implementation (`otel`). DESIGN.md §2:
observability lives in a package of its own.
"""
