"""Micro-benchmark of the sans-IO protocol core on a typical vLLM content chunk.

Prints µs per event for each stage the relay runs on every streamed event:
SSE decode, JSON decode, token-ID validation, exposure, re-encode, and the
non-streaming assembler. Not a test; run it with
`python scripts/bench_protocol.py [--events N] [--per-read K]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import decode_event, encode_event, encode_sse_event
from narwhal.protocol.exposure import Exposed, Exposure, apply_exposure
from narwhal.protocol.sse import SSEDecoder, format_event
from narwhal.protocol.tokens import count_event_token_ids

# vLLM 0.33 with return_token_ids (PROTOCOL.md §1.2, §2.2): what nearly every event is.
CHUNK = (
    b'data: {"id":"chatcmpl-b9f1c6a2e4d84f7c9a1e2b3c4d5e6f70","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,'
    b'"delta":{"content":" the"},"logprobs":null,"finish_reason":null,"token_ids":[279]}],'
    b'"kv_transfer_params":null}\n\n'
)
FINISH = (
    b'data: {"id":"chatcmpl-b9f1c6a2e4d84f7c9a1e2b3c4d5e6f70","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,'
    b'"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[],'
    b'"weight_versions":null}],"kv_transfer_params":null}\n\n'
)

DEFAULT_CLIENT = Exposure(token_ids=False, usage=False, continuous_usage=False)
IDS_AND_USAGE = Exposure(token_ids=True, usage=True, continuous_usage=False)


def reads(events: int, per_read: int) -> list[bytes]:
    """The stream as the socket delivers it: `per_read` whole events per read."""
    body = [CHUNK] * events
    return [b"".join(body[i : i + per_read]) for i in range(0, events, per_read)]


def sse_only(chunks: list[bytes]) -> None:
    decoder = SSEDecoder()
    for chunk in chunks:
        decoder.feed(chunk)


def relay(exposure: Exposure, framer: str = "encode_sse_event") -> Callable[[list[bytes]], None]:
    frame = encode_sse_event if framer == "encode_sse_event" else _format

    def run(chunks: list[bytes]) -> None:
        decoder = SSEDecoder()
        out: list[bytes] = []
        count = 0
        for chunk in chunks:
            for sse in decoder.feed(chunk):
                event = decode_event(sse.data)
                count += count_event_token_ids(event, "chat")
                verdict = apply_exposure(event, exposure)
                if verdict is Exposed.UNCHANGED:
                    out.append(sse.raw)
                elif verdict is Exposed.CHANGED:
                    out.append(frame(event))

    return run


def _format(event: dict[str, Any]) -> bytes:
    return format_event(encode_event(event))


def relay_decode(chunks: list[bytes]) -> None:
    """The decoder as the relay drives it: `single`, else `feed_run`."""
    decoder = SSEDecoder()
    single = decoder.single
    feed_run = decoder.feed_run
    for chunk in chunks:
        if single(chunk) is None:
            feed_run(chunk)


# Lines that are no event, as a hostile engine floods them (and vLLM's keep-alive).
FLOODS = [b":\n\n", b"\n", b"event: x\n\n", b": keep-alive\r\n\r\n", b"\r"]


def flood_mb_per_s(unit: bytes, read: int = 1 << 16, total: int = 8 << 20) -> float:
    chunk = unit * (read // len(unit))
    best = float("inf")
    for _ in range(5):
        decoder = SSEDecoder(max_event_bytes=2 * total)
        start = time.perf_counter()
        for _ in range(total // len(chunk)):
            decoder.feed(chunk)
        best = min(best, time.perf_counter() - start)
    return total // len(chunk) * len(chunk) / best / 1e6


def assemble(chunks: list[bytes]) -> None:
    decoder = SSEDecoder()
    assembler = Assembler("chat", DEFAULT_CLIENT)
    count = 0
    for chunk in [*chunks, FINISH]:
        for sse in decoder.feed(chunk):
            event = decode_event(sse.data)
            count += count_event_token_ids(event, "chat")
            assembler.add(event)
    assembler.result(prompt_tokens=10, completion_tokens=count)


def best_us_per_event(run: Callable[[list[bytes]], None], chunks: list[bytes], n: int) -> float:
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        run(chunks)
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--per-read", type=int, default=4, help="whole events per socket read")
    args = parser.parse_args()
    chunks = reads(args.events, args.per_read)
    n = args.events
    print(f"{n} events, {args.per_read} per read, {len(CHUNK)} bytes each")
    rows = [
        ("SSE decode only", sse_only),
        ("SSE decode as the relay drives it (single, feed_run)", relay_decode),
        ("relay, client asked IDs+usage (raw bytes forwarded)", relay(IDS_AND_USAGE)),
        ("relay, default client (IDs removed, re-encoded)", relay(DEFAULT_CLIENT)),
        (
            "relay, default client, format_event(encode_event(...))",
            relay(DEFAULT_CLIENT, "format_event"),
        ),
        ("non-streaming: decode + validate + assemble", assemble),
    ]
    for name, run in rows:
        print(f"{best_us_per_event(run, chunks, n):7.2f} µs/event  {name}")
    single = [CHUNK] * n  # one event per read: the worst case for per-read overhead
    print(f"{best_us_per_event(relay(DEFAULT_CLIENT), single, n):7.2f} µs/event  "
          "relay, default client, one event per read")  # fmt: skip
    for unit in FLOODS:
        print(
            f"{flood_mb_per_s(unit):7.0f} MB/s     SSE decode of lines that are no event, {unit!r}"
        )


if __name__ == "__main__":
    main()
