"""Cost of reading one /metrics page: Narwhal's scanner against prometheus_client's parser.

Run from the checkout: `python -m tests.fleet.bench_scrape`. Not collected by pytest.
"""

from __future__ import annotations

import timeit

from prometheus_client.parser import text_string_to_metric_families

from narwhal.fleet.scrape import parse_engine_metrics
from tests.fleet.exposition import vllm_page


def _per_call_us(func: object, budget_s: float = 1.0) -> float:
    timer = timeit.Timer(func)  # type: ignore[arg-type]
    number, _ = timer.autorange()
    repeats = max(3, int(budget_s / max(timer.timeit(number) / number, 1e-9) / number))
    best = min(timer.repeat(repeat=min(repeats, 7), number=number))
    return best / number * 1e6


def main() -> None:
    print(f"{'page':<22}{'bytes':>8}{'lines':>7}{'scanner µs':>13}{'prometheus_client µs':>22}")
    for dp in (1, 2, 8):
        text = vllm_page(dp)
        ours = _per_call_us(lambda text=text: parse_engine_metrics(text, ("vllm",)))
        theirs = _per_call_us(lambda text=text: list(text_string_to_metric_families(text)))
        label = f"vLLM, {dp} DP engine{'s' if dp > 1 else ''}"
        print(f"{label:<22}{len(text):>8}{text.count(chr(10)):>7}{ours:>13.1f}{theirs:>22.0f}")


if __name__ == "__main__":
    main()
