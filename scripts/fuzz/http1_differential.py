"""Differential fuzzing of Narwhal's HTTP/1.1 response parser against h11, for minutes.

The property of `tests/protocol/test_http1_differential.py` (the generator in
`tests/protocol/http1_responses.py`, the comparison and the allowed divergences in
`tests/protocol/http1_differential.py`) with many more examples, and without stopping at
the first divergence: every case runs, each divergence is counted by kind, and the
shortest case of each kind is printed. Not a test: CI runs the property with a few
hundred examples. Needs the dev extra (h11, hypothesis); tests the checkout it
lives in:

    python scripts/fuzz/http1_differential.py [--examples 200000] [--seconds N] [--seed S]

Prints how many cases ran, how they came out (both accept, both refuse, each allowed
divergence), and the divergences; exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # this checkout's narwhal, and its tests

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.protocol.http1_differential import Divergence, check  # noqa: E402
from tests.protocol.http1_responses import Case, responses  # noqa: E402

BATCH = 1000  # examples per hypothesis run; the time limit is checked between runs


class Tally:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.cases = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.shortest: dict[str, tuple[Case, str]] = {}  # per divergence kind

    def run(self, case: Case) -> None:
        if time.monotonic() > self.deadline:
            return  # (the batch runs out without work)
        self.cases += 1
        try:
            self.outcomes[check(case)] += 1
            return
        except Divergence as e:
            kind, detail = f"DIVERGENCE {e.kind}", str(e)
        except Exception as e:  # Narwhal raised something else than HTTPProtocolError
            kind, detail = f"CRASH {type(e).__name__}", traceback.format_exc()
        self.outcomes[kind] += 1
        known = self.shortest.get(kind)
        if known is None or len(case.raw) < len(known[0].raw):
            self.shortest[kind] = (case, detail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--seed", type=int, default=None, help="for a repeatable run")
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.seconds if args.seconds else float("inf")
    tally = Tally(deadline)
    batch = 0
    while tally.cases < args.examples and time.monotonic() < deadline:
        count = min(BATCH, args.examples - tally.cases)
        test = settings(
            max_examples=count,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(given(responses())(lambda case: tally.run(case)))
        if args.seed is not None:
            test = seed(args.seed * 1_000_003 + batch)(test)
        before = tally.cases
        test()
        batch += 1
        if tally.cases == before:
            break  # hypothesis ran out of new cases (or the time did)
        elapsed = time.monotonic() - started
        print(f"{tally.cases:>9,} cases  {elapsed:7.1f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started
    print(f"{tally.cases:,} cases in {elapsed:.1f} s ({tally.cases / elapsed:,.0f}/s)")
    for outcome, n in sorted(tally.outcomes.items(), key=lambda kv: -kv[1]):
        print(f"{n:>9,}  {outcome}")
    for kind, (case, detail) in tally.shortest.items():
        print(f"\n{kind}: shortest case ({len(case.raw)} bytes)")
        print(f"  raw={case.raw!r}\n  cuts={case.cuts} method={case.method!r}")
        print(f"  features={sorted(case.features)}\n  {detail}")
    sys.exit(1 if tally.shortest else 0)


if __name__ == "__main__":
    main()
