"""A fault-injecting TCP proxy on loopback, run in a thread of the test process.

Between a router and what it talks to (etcd, an engine), it forwards bytes both ways
until told otherwise:

- `blackhole()`: a network partition. Connections stay open and new ones are accepted,
  but nothing is forwarded in either direction, so the peer sees timeouts, not errors.
- `reset()`: every open connection is closed at once (the peer sees resets).
- `heal()`: forward again (connections made from then on work; blackholed ones stay dead,
  as after a real partition the peer's timeouts have given up on them).
- `shape(latency_s=, bytes_per_s=)`: every chunk is delayed by `latency_s` and the flow
  in each direction is held to `bytes_per_s` (a slow or distant network).
- `half_open()`: the target's bytes stop reaching the client while the client's still
  reach the target (the connection looks open from both ends); `heal()` ends it.
- `reset_after(n)`: from now on, a connection is reset once `n` more bytes came back
  from the target through it (a connection cut in the middle of a response); pooled
  connections count from the moment the fault is set, like new ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_CHUNK = 65536


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._blackholed = False
        self._half_open = False
        self._epoch = 0  # connections made before a blackhole stay dead after it heals
        self._latency_s = 0.0
        self._bytes_per_s: float | None = None
        self._reset_after: int | None = None
        self._reset_epoch = 0
        self.connections = 0  # accepted so far
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self._call(self._set_blackhole, True)

    def heal(self) -> None:
        self._call(self._set_blackhole, False)
        self._half_open = False

    def shape(self, latency_s: float = 0.0, bytes_per_s: float | None = None) -> None:
        self._latency_s, self._bytes_per_s = latency_s, bytes_per_s

    def half_open(self) -> None:
        self._half_open = True

    def reset_after(self, n: int | None) -> None:
        self._reset_after = n
        self._reset_epoch += 1

    def reset(self) -> None:
        self._call(self._close_all)

    def close(self) -> None:
        async def shutdown() -> None:
            self._close_all()
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, fn: object, *args: object) -> None:
        async def run() -> None:
            fn(*args)  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _set_blackhole(self, on: bool) -> None:
        if on and not self._blackholed:
            self._epoch += 1
        self._blackholed = on
        if on:
            self._open.clear()
        else:
            self._open.set()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _listen(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections += 1
        epoch = self._epoch
        try:
            await self._open.wait()  # while blackholed: accepted, never connected onward
            epoch = self._epoch
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer, epoch, downstream=False),
            self._pipe(up_reader, writer, epoch, downstream=True),
        )

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        epoch: int,
        *,
        downstream: bool,
    ) -> None:
        since = 0  # bytes back from the target since the reset fault was (re)armed
        armed = self._reset_epoch
        try:
            while True:
                data = await reader.read(_CHUNK if self._bytes_per_s is None else 1024)
                if not data:
                    break
                if self._blackholed or epoch != self._epoch:
                    continue  # dropped on the floor, as by a partition
                if downstream and self._half_open:
                    continue
                if self._latency_s:
                    await asyncio.sleep(self._latency_s)
                if self._bytes_per_s is not None:
                    await asyncio.sleep(len(data) / self._bytes_per_s)
                limit = self._reset_after if downstream else None
                if armed != self._reset_epoch:
                    armed, since = self._reset_epoch, 0
                if limit is not None and since + len(data) >= limit:
                    writer.write(data[: max(0, limit - since)])
                    writer.transport.abort()
                    return
                since += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not writer.is_closing():
                writer.close()
            self._writers.discard(writer)


@contextmanager
def fault_proxy(target_host: str, target_port: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(target_host, target_port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()
