"""/healthz and /readyz: liveness while the loop answers, readiness while running with a
database that answers, on every backend."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiohttp
import pytest
from slotcron.errors import ConfigError
from slotcron.http.probes import READY_TIMEOUT
from slotcron.jobs.registry import Registry, every

from tests.conftest import Services, wait_for
from tests.http.conftest import base_url
from tests.http.proxy import Proxy


def quiet_jobs() -> Registry:
    registry = Registry()

    @every(hours=24, name="probe.daily", registry=registry)
    async def daily() -> None:
        pass

    return registry


async def get(client: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with client.get(url) as response:
        return response.status, await response.json()


async def test_healthz_and_readyz_answer_200_while_the_instance_runs(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(quiet_jobs()))
    url = base_url(service)
    assert await get(client, f"{url}/healthz") == (
        200,
        {"status": "ok", "instance": service.instance_id, "state": "running"},
    )
    status, body = await get(client, f"{url}/readyz")
    assert (status, body["status"], body["state"], body["database"]) == (
        200,
        "ready",
        "running",
        "ok",
    )
    # PostgreSQL's replication is said too: the shared test server has no standby.
    replication = {"postgresql": "no standby streams from this server: nothing to fail over to"}
    assert body.get("replication") == replication.get(service.db.dialect.name)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
async def test_readyz_turns_503_when_the_database_is_cut_off_or_hangs_and_200_when_it_is_back(
    backend: str, db_url: str, services: Services, client: aiohttp.ClientSession
) -> None:
    proxy = await Proxy.for_url(db_url).start()
    service = await services.start(list(quiet_jobs()), url=proxy.url(db_url), http_port=0)
    url = base_url(service)
    try:
        assert (await get(client, f"{url}/readyz"))[0] == 200

        await proxy.down()
        _, body = await wait_for(
            lambda: _not_ready(client, url), timeout=10, what="/readyz 503 with the database cut"
        )
        assert body["state"] == "running" and body["database"] != "ok", body
        assert (await get(client, f"{url}/healthz"))[0] == 200  # alive all the same

        await proxy.up()
        await wait_for(lambda: _ready(client, url), timeout=15, what="/readyz 200 again")

        await proxy.hang()
        began = time.monotonic()
        _, body = await wait_for(
            lambda: _not_ready(client, url), timeout=10, what="/readyz 503 with a hung database"
        )
        took = time.monotonic() - began
        assert "no answer within" in body["database"], body
        assert took < READY_TIMEOUT + 3, f"a hung database held /readyz for {took:.1f} s"
        await proxy.up()
        await wait_for(lambda: _ready(client, url), timeout=15, what="/readyz 200 after the hang")
    finally:
        await proxy.up()
        await service.stop()
        await proxy.close()


async def _not_ready(client: aiohttp.ClientSession, url: str) -> tuple[int, Any] | None:
    status, body = await get(client, f"{url}/readyz")
    return (status, body) if status == 503 else None


async def _ready(client: aiohttp.ClientSession, url: str) -> bool:
    return (await get(client, f"{url}/readyz"))[0] == 200


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # (its database is its own)
async def test_while_the_database_is_waited_out_at_start_up_readyz_is_503_and_no_password_shows(
    services: Services, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    url_with_password = f"postgresql+asyncpg://slotcron:s3cret-pw@127.0.0.1:{closed_port}/none"
    service = services.make(list(quiet_jobs()), url=url_with_password, http_port=0)
    starting = asyncio.create_task(service.start())
    try:
        await wait_for(lambda: service.http is not None and service.http.port != 0, what="HTTP")
        url = base_url(service)
        _, body = await wait_for(lambda: _not_ready(client, url), what="/readyz 503")
        assert body["state"] == "starting", body
        assert (await get(client, f"{url}/healthz"))[0] == 200
        async with client.get(f"{url}/api/jobs") as response:
            assert response.status == 503
            text = await response.text()
        assert "database unavailable" in text
        for shown in (str(body), text, caplog.text):
            assert "s3cret-pw" not in shown
    finally:
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await service.db.close()
    # Cancelling the start-up stopped the HTTP server too.
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(client, f"{url}/healthz")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_port_already_in_use_is_a_configuration_error_naming_SCHEDULER_HTTP_PORT(
    services: Services,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = services.make(list(quiet_jobs()), http_port=port)
        with pytest.raises(ConfigError) as refused:
            await service.start()
    assert refused.value.variable == "SCHEDULER_HTTP_PORT"
    assert str(port) in str(refused.value)
    await service.db.close()
