"""Connections are bounded: idle or trickling sockets are closed, their number is capped, and
the probes keep answering when the cap is reached (issue 13, item 3)."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slotcron.http import server as http_server

from tests.cluster.harness import read_records
from tests.conftest import Spawn, wait_for
from tests.http.conftest import base_url, listening_url

IDLE_SOCKETS = 1100
SERVER_FILE_LIMIT = 1024
"""The usual default soft limit, which 1,100 idle sockets exhausted before the cap."""


def raise_own_file_limit(at_least: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < at_least:
        if hard != resource.RLIM_INFINITY and hard < at_least:
            pytest.skip(f"this test needs {at_least} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, hard))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_idle(host: str, port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect((host, port))
        sockets.append(s)
    return sockets


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts descriptors in /proc")
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_1100_idle_sockets_neither_exhaust_descriptors_nor_keep_the_probes_out(
    spawn: Spawn, records_path: Path
) -> None:
    raise_own_file_limit(IDLE_SOCKETS + 512)
    proc = spawn("idle", "tests.http.jobs_http")
    url = listening_url(proc)
    # The server's own limit as on a stock machine: the test raises nothing for it.
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (SERVER_FILE_LIMIT, SERVER_FILE_LIMIT))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    baseline = open_fds(proc.pid)

    sockets = await asyncio.to_thread(open_idle, host, int(port), IDLE_SOCKETS)
    bound = baseline + http_server.HARD_MAX_CONNECTIONS
    try:
        peak = open_fds(proc.pid)
        await wait_for(lambda: open_fds(proc.pid) <= bound, timeout=5, what="evictions")
        held = open_fds(proc.pid)
        started = time.monotonic()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client,
            client.get(f"{url}/healthz") as response,
        ):
            assert response.status == 200
        healthz_took = time.monotonic() - started
        ran_before = len(read_records(records_path))
        await wait_for(
            lambda: len(read_records(records_path)) >= ran_before + 2,
            timeout=10,
            what="two more runs while the sockets are held",
        )
        held_after = open_fds(proc.pid)
    finally:
        for s in sockets:
            s.close()
    print(
        f"\nfile descriptors of the server: {baseline} before, {peak} just after opening "
        f"{IDLE_SOCKETS} idle sockets, {held} settled, {held_after} after /healthz and two "
        f"runs; /healthz took {healthz_took * 1000:.0f} ms"
    )
    assert peak <= bound + http_server.BACKLOG, peak
    assert held <= bound, held
    assert held_after <= bound, held_after
    assert "Too many open files" not in proc.full_log()
    assert proc.alive()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_socket_that_never_completes_its_headers_is_closed(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "KEEPALIVE_SECONDS", 1.0)
    service = await serve([])
    host, port = base_url(service).removeprefix("http://").rsplit(":", 1)
    silent_reader, silent = await asyncio.open_connection(host, int(port))
    trickle_reader, trickle = await asyncio.open_connection(host, int(port))
    trickle.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
    await trickle.drain()
    started = time.monotonic()
    try:
        for reader in (silent_reader, trickle_reader):
            assert await asyncio.wait_for(reader.read(), 10) == b""
        assert time.monotonic() - started < 5
    finally:
        silent.close()
        trickle.close()
