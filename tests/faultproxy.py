"""A fault-injecting TCP proxy on loopback, run in a thread of the test process.

Between a router and what it talks to (etcd, an engine), it forwards bytes both ways
until told otherwise:

- `blackhole()`: a network partition. Connections stay open and new ones are accepted,
  but nothing is forwarded in either direction, so the peer sees timeouts, not errors.
- `reset()`: every open connection is closed at once (the peer sees resets).
- `heal()`: forward again (connections made from then on work; blackholed ones stay dead,
  as after a real partition the peer's timeouts have given up on them).
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
        self._epoch = 0  # connections made before a blackhole stay dead after it heals
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
            self._pipe(reader, up_writer, epoch), self._pipe(up_reader, writer, epoch)
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, epoch: int
    ) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if self._blackholed or epoch != self._epoch:
                    continue  # dropped on the floor, as by a partition
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
