"""Prometheus text exposition of a registry, the same bytes as prometheus_client's, faster.

`/metrics` is rendered on the event loop, so while it renders every stream and every
refusal waits. prometheus_client's `generate_latest` spends most of its time re-escaping
and re-validating the same names and label sets on every scrape (about 8 µs a sample
here: 2-3 ms for the router's few hundred samples, 3-5 ms with the engines' series).
Which series exist changes rarely, so each sample's name-and-labels prefix is built once
and kept; a scrape then costs the registry's own collection plus one value format per
sample.

The output is byte for byte what `generate_latest(registry)` gives (the Prometheus text
format 0.0.4, legacy name escaping), which `tests/test_exposition.py` holds against the
router's own registry; names are not re-checked here because every metric the router
registers has a legacy-valid name (prometheus_client refuses others at registration).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


class Collected(Protocol):
    """A registry, or anything that collects like one (`merged.MergedRegistry`)."""

    def collect(self) -> Iterable[Metric]: ...


# OpenMetrics-only samples that the text format moves into gauges after their family.
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
# Prefixes kept at most this many; past it (series with unbounded label values, which the
# router does not make) they are built per scrape rather than growing without bound.
_MAX_PREFIXES = 65_536


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Exposition:
    """Renders one registry; keeps what it learnt about its series between scrapes."""

    def __init__(self, registry: Collected) -> None:
        self._registry = registry
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def render(self) -> bytes:
        output: list[str] = []
        append = output.append
        prefix_of = self._prefix
        for metric in self._registry.collect():
            name, kind = metric.name, metric.type
            if kind == "counter":
                exposed = name + "_total"
            elif kind == "info":
                exposed = name + "_info"
            else:
                exposed = name
            documentation = _escape_help(metric.documentation)
            append(f"# HELP {exposed} {documentation}\n")
            append(f"# TYPE {exposed} {_TYPES.get(kind, kind)}\n")
            trailing: dict[str, list[str]] = {}
            for sample in metric.samples:
                value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
                line = prefix_of(sample.name, sample.labels) + value
                if sample.timestamp is not None:
                    line += f" {int(float(sample.timestamp) * 1000):d}"
                line += "\n"
                suffix = None
                if sample.name.endswith(_OPENMETRICS_SUFFIXES):
                    suffix = _openmetrics_suffix(name, sample.name)
                if suffix is None:
                    append(line)
                else:
                    trailing.setdefault(suffix, []).append(line)
            for suffix, lines in sorted(trailing.items()):
                append(f"# HELP {name}{suffix} {documentation}\n")
                append(f"# TYPE {name}{suffix} gauge\n")
                output.extend(lines)
        return "".join(output).encode("utf-8")

    def _prefix(self, name: str, labels: dict[str, str]) -> str:
        key = (name, tuple(labels.items()))
        prefix = self._prefixes.get(key)
        if prefix is None:
            if labels:
                pairs = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
                prefix = f"{name}{{{pairs}}} "
            else:
                prefix = f"{name} "
            if len(self._prefixes) < _MAX_PREFIXES:
                self._prefixes[key] = prefix
        return prefix


def _openmetrics_suffix(family: str, sample: str) -> str | None:
    for suffix in _OPENMETRICS_SUFFIXES:
        if sample == family + suffix:
            return suffix
    return None
