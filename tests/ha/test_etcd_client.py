"""The etcd calls high availability makes, against a real etcd through its JSON gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from narwhal.ha.etcd import EtcdClient, EtcdUnavailable, LeaseNotFound
from tests.etcd_server import EtcdServer, etcd_server


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with etcd_server() as server:
        yield server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_a_campaign_creates_the_key_only_if_absent(
    etcd: EtcdServer, session: aiohttp.ClientSession
) -> None:
    client = EtcdClient([etcd.url], session, timeout_s=2)
    first, ttl = await client.grant(1)
    second, _ = await client.grant(1)
    assert ttl == 1
    won = await client.create_if_absent("/t1/leader", b"a", first)
    lost = await client.create_if_absent("/t1/leader", b"b", second)
    assert won.won and not lost.won
    assert lost.holder is not None and lost.holder.lease == first
    assert lost.holder.value == b"a"
    assert lost.holder.create_revision == won.revision
    held = await client.get("/t1/leader")
    assert held is not None and held.create_revision == won.revision


async def test_a_lease_that_is_not_renewed_expires_and_takes_the_key_with_it(
    etcd: EtcdServer, session: aiohttp.ClientSession
) -> None:
    client = EtcdClient([etcd.url], session, timeout_s=2)
    lease, _ = await client.grant(1)
    result = await client.create_if_absent("/t2/leader", b"a", lease)
    assert await client.keepalive(lease) == 1
    changed = await client.watch("/t2/leader", result.revision, timeout_s=5)
    assert changed
    assert await client.get("/t2/leader") is None
    assert await client.keepalive(lease) == 0  # gone: no TTL left
    with pytest.raises(LeaseNotFound):
        await client.create_if_absent("/t2/leader", b"a", lease)


async def test_revoking_deletes_the_key_at_once(
    etcd: EtcdServer, session: aiohttp.ClientSession
) -> None:
    client = EtcdClient([etcd.url], session, timeout_s=2)
    lease, _ = await client.grant(30)
    await client.create_if_absent("/t3/leader", b"a", lease)
    await client.revoke(lease)
    await client.revoke(lease)  # already gone: not an error
    assert await client.get("/t3/leader") is None


async def test_a_watch_that_sees_no_change_ends_at_its_timeout(
    etcd: EtcdServer, session: aiohttp.ClientSession
) -> None:
    client = EtcdClient([etcd.url], session, timeout_s=2)
    lease, _ = await client.grant(30)
    result = await client.create_if_absent("/t4/leader", b"a", lease)
    assert not await client.watch("/t4/leader", result.revision, timeout_s=0.3)
    await client.revoke(lease)


async def test_prefix_reads_cover_the_keys_under_the_prefix_only(
    etcd: EtcdServer, session: aiohttp.ClientSession
) -> None:
    client = EtcdClient([etcd.url], session, timeout_s=2)
    await client.put("/t5/leader/drained/e0", b"1")
    await client.put("/t5/leader/maintenance/2", b"1")
    await client.put("/t5/leaderx", b"1")
    await client.put("/t5/leader", b"1")
    keys = [kv.key for kv in await client.get_prefix("/t5/leader/")]
    assert keys == ["/t5/leader/drained/e0", "/t5/leader/maintenance/2"]
    await client.delete("/t5/leader/drained/e0")
    assert [kv.key for kv in await client.get_prefix("/t5/leader/")] == ["/t5/leader/maintenance/2"]


async def test_a_dead_endpoint_is_skipped_for_a_live_one(
    etcd: EtcdServer, session: aiohttp.ClientSession, closed_port: int
) -> None:
    client = EtcdClient([f"http://127.0.0.1:{closed_port}", etcd.url], session, timeout_s=2)
    lease, _ = await client.grant(1)
    assert await client.keepalive(lease) == 1


async def test_no_endpoint_answering_is_unavailable_within_the_timeout(
    session: aiohttp.ClientSession, closed_port: int
) -> None:
    client = EtcdClient([f"http://127.0.0.1:{closed_port}"], session, timeout_s=0.5)
    with pytest.raises(EtcdUnavailable):
        await client.grant(1)
    # A blackhole (accepts, never answers) ends at the timeout, not later.
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent = EtcdClient([f"http://127.0.0.1:{port}"], session, timeout_s=0.3)
    started = asyncio.get_running_loop().time()
    with pytest.raises(EtcdUnavailable):
        await silent.keepalive(1)
    assert asyncio.get_running_loop().time() - started < 1.0
    for writer in accepted:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_an_endpoint_that_answers_without_end_is_cut_off_not_buffered(
    session: aiohttp.ClientSession,
) -> None:
    """Something that is not etcd on the endpoint: an endless body is refused at the cap."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
        try:
            while True:
                writer.write(b" " * 65536)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EtcdClient([f"http://127.0.0.1:{port}"], session, timeout_s=10)
    with pytest.raises(EtcdUnavailable, match="more than"):
        await client.grant(1)
    server.close()
    await server.wait_closed()
