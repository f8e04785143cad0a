"""Plot `scripts/perf/admission.py --json` results of several engines side by side.

One row per results file: goodput (requests a second within the TTFT budget) and the
share of admitted requests within the budget, against the offered load, one line per
policy. Needs matplotlib (`pip install '.[plot]'`).

    python scripts/perf/plot_admission.py OUT.png NAME=RESULTS.json [NAME=RESULTS.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(argv[0])
    named = [arg.partition("=") for arg in argv[1:]]
    figure, axes = plt.subplots(len(named), 2, figsize=(11, 3.2 * len(named)), squeeze=False)
    for (name, _, path), (left, right) in zip(named, axes, strict=True):
        results: dict[str, Any] = json.loads(Path(path).read_text())
        runs = [r for r in results["runs"] if r.get("shape", "poisson") == "poisson"]
        capacity = results.get("capacity")
        for policy in ("open", "queue", "predictive"):
            mine = sorted((r for r in runs if r["policy"] == policy), key=lambda r: r["level"])
            if not mine:
                continue
            levels = [r["level"] for r in mine]
            goodput = [r["summary"]["goodput_per_s"] for r in mine]
            within = [100 * (r["summary"]["admission"]["admitted_attainment"] or 0) for r in mine]
            left.plot(levels, goodput, marker="o", label=policy)
            right.plot(levels, within, marker="o", label=policy)
        title = name if capacity is None else f"{name} (capacity {capacity:.1f} req/s)"
        left.set_title(title, fontsize=10)
        left.set_ylabel("goodput req/s")
        right.set_ylabel("admitted within budget (%)")
        right.set_ylim(0, 105)
        for axis in (left, right):
            axis.set_xlabel("offered load (x capacity)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
