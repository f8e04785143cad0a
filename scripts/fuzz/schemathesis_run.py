"""Schema-driven fuzzing of every route: schemathesis against Narwhal's shipped OpenAPI
document (src/narwhal/openapi.yaml), outside CI.

Starts one `narwhal sim` (time scale 0, short outputs) and one `narwhal serve` in front of
it on ephemeral loopback ports (scripts/perf/harness.py's process handling: own session,
stopped by PID on every exit), then runs schemathesis (examples, coverage, fuzzing and
stateful phases, bounded by --max-examples per operation and --max-time in all) with
these checks:

- not_a_server_error: no 5xx at all (the fleet is kept healthy, so none is expected);
- status_code_conformance, content_type_conformance, response_headers_conformance,
  response_schema_conformance: every answer is one the document declares, with the
  declared media type, required headers (X-Request-Id) and a body (or each SSE event)
  matching its schema;
- negative_data_rejection: a request the document says is invalid is refused with a 4xx;
- unsupported_method, allow_header_conformance: an undeclared method is a 405 whose Allow
  lists the declared methods.

Four generated bodies in five name the configured model (a schemathesis dictionary), so
that they get past the 404 to admission, placement and the engine.

Two passes, because schemathesis feeds values from responses into later requests: it
reads the engine's name and wave from GET /admin/engines and drains it or puts its wave
in maintenance, after which every completion is a (declared) 503 that not_a_server_error
would count as a failure. So the first pass (most of the time) is every route except
drain, undrain and maintenance; the second, those three with GET /admin/engines.

Afterwards the router's log must hold no ERROR and no traceback, and its /metrics must
balance: narwhal_offered_total equals the sum of narwhal_outcomes_total. Exit status 0
only when all of that holds; the logs are kept (path printed) when it does not.

schemathesis is heavy and not a project dependency (not in the dev extra); install it
into the venv that runs this script, for the run only:

    /work/main/.venv/bin/pip install schemathesis
    /work/main/.venv/bin/python scripts/fuzz/schemathesis_run.py [--max-examples 100]
        [--max-time 240] [--seed N] [--admission open|predictive] [--keep-logs]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
import harness
from harness import HOST, MODEL, Processes, Server, log

DOCUMENT = Path(__file__).resolve().parents[2] / "src" / "narwhal" / "openapi.yaml"
MAX_TIME_LIMIT_S = 300
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "unsupported_method",
    "allow_header_conformance",
)
# Operations that change placement: fuzzed in a pass of their own (see the docstring).
PLACEMENT_CHANGING = ("drainEngine", "undrainEngine", "setMaintenance")
PASSES = (
    ("routes", 0.8, ["--exclude-operation-id-regex", f"^({'|'.join(PLACEMENT_CHANGING)})$"]),
    ("admin", 0.2, ["--include-tag", "admin"]),
)
ENGINE_NAME = "fuzzed-engine"
_SUMMARY = re.compile(r"^\s*\d+ generated, .*$", re.M)
_BAD_LOG_LINE = re.compile(r"\bERROR\b|Traceback")
_OUTCOME = re.compile(r'^narwhal_outcomes_total\{outcome="([^"]+)"\}\s+(\S+)', re.M)
_OFFERED = re.compile(r"^narwhal_offered_total\s+(\S+)", re.M)


def _router_config(path: Path, engine: Server, admission: str) -> Path:
    config = {
        "model": MODEL,
        "serving": {"host": HOST, "port": 0, "request_timeout_s": 20},
        "admission": {"mode": admission},
        "engines": [
            {
                "name": ENGINE_NAME,
                "url": engine.url,
                "dialect": "vllm",
                "role": "both",
                "wave": 1,
            }
        ],
    }
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return path


# Most generated bodies name the configured model, so that they get past the 404 and reach
# admission, placement and the engine; the rest name any model (and test that 404).
SCHEMATHESIS_CONFIG = f"""
[dictionaries.models]
values = ["{MODEL}"]

[parameters]
"body.model" = {{ dictionary = "models", probability = 0.8 }}
"""


def _schemathesis(
    url: str, args: argparse.Namespace, selection: list[str], max_time: int, out: Path
) -> tuple[int, float]:
    config = out.parent / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        str(DOCUMENT),
        "--url",
        url,
        *selection,
        "--checks",
        ",".join(CHECKS),
        "--max-examples",
        str(args.max_examples),
        "--max-time",
        str(max_time),
        "--workers",
        "1",  # two cores hold the client, the router and the engine
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--no-color",
    ]
    if args.seed is not None:
        command += ["--seed", str(args.seed)]
    log(f"schemathesis {' '.join(command[5:])}")
    started = time.monotonic()
    with open(out, "wb") as stream:
        try:
            code = subprocess.run(
                command,
                stdout=stream,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=out.parent,  # where schemathesis leaves any file of its own
                timeout=max_time + 120,  # its own budget, plus shrinking and reporting
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
    return code, time.monotonic() - started


def _summary(output: str) -> str:
    """The summary schemathesis prints last (failures listed above it)."""
    at = output.rfind("SUMMARY")
    return output[output.rfind("\n", 0, at) + 1 :] if at >= 0 else output[-4000:]


def _balanced(router: Server, timeout_s: float = 15.0) -> tuple[float, dict[str, float]]:
    """(offered, outcomes) once the router is quiescent: offered = sum of outcomes, or
    the last reading when that does not come within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = harness.http_get_text(f"{router.url}/metrics")
        match = _OFFERED.search(text)
        offered = float(match.group(1)) if match else -1.0
        outcomes = {name: float(value) for name, value in _OUTCOME.findall(text)}
        if offered == sum(outcomes.values()) or time.monotonic() > deadline:
            return offered, outcomes
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=100, help="per operation")
    parser.add_argument("--max-time", type=int, default=240, help="seconds, at most 300")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--admission", choices=("open", "predictive"), default="open")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.max_time = max(1, min(args.max_time, MAX_TIME_LIMIT_S))
    if importlib.util.find_spec("schemathesis") is None:
        print(f"schemathesis is not installed: {sys.executable} -m pip install schemathesis")
        return 2
    with Processes(keep_logs=args.keep_logs) as procs:
        sim = procs.sim("sim", "--time-scale", "0", "--output-len-mean", "8", "--model", MODEL)
        config = _router_config(procs.log_dir / "router.yaml", sim, args.admission)
        router = procs.router("router", config)
        codes: list[int] = []
        figures: list[str] = []
        for name, share, selection in PASSES:
            report = procs.log_dir / f"schemathesis-{name}.out"
            budget = max(1, round(args.max_time * share))
            code, wall_s = _schemathesis(router.url, args, selection, budget, report)
            router.check_alive()
            output = report.read_text(errors="replace")
            print(f"## pass '{name}'\n{_summary(output)}")
            summary = _SUMMARY.search(output)
            figures.append(
                f"pass '{name}': exit {code}, {wall_s:.0f} s; "
                f"{summary.group(0).strip() if summary else '?'}"
            )
            codes.append(code)
        offered, outcomes = _balanced(router)
        router_log = router.log_path.read_text(errors="replace")
        bad_lines = [line for line in router_log.splitlines() if _BAD_LOG_LINE.search(line)]
        print(f"revision: {harness.stamp(harness.narwhal_revision())}")
        print("\n".join(figures))
        counted = {k: int(v) for k, v in outcomes.items() if v}
        print(
            f"router: offered {offered:.0f}, sum of outcomes {sum(outcomes.values()):.0f} {counted}"
        )
        print(f"router log: {len(bad_lines)} ERROR/traceback lines")
        for line in bad_lines[:20]:
            print(f"  {line}")
        if any(codes) or bad_lines or offered != sum(outcomes.values()):
            # Leaving through Processes' exit with an exception keeps the logs: the evidence.
            raise SystemExit(1)
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_main(main))
