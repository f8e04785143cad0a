"""Reading Prometheus text exposition in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[str, float]:
    """{'name{label="v",...}': value} for every sample, labels sorted."""
    result: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            result[key] = sample.value
    return result


def total(values: dict[str, float], name: str) -> float:
    """Sum of every sample of `name`, whatever its labels."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def series(name: str, **labels: str) -> str:
    """The key `samples` gives the sample `name` with `labels`."""
    pairs = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{pairs}}}" if pairs else name
