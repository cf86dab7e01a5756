"""Services serving HTTP on a free port of 127.0.0.1, and a client to ask them."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from slotcron.http import auth as http_auth
from slotcron.service.service import Service

from tests.cluster.harness import Instance, wait_until
from tests.conftest import ServiceFactory, Spawn

TOKEN = "test-admin-token-8c1f"
READ_TOKEN = "test-read-token-51d0"

_LISTENING = re.compile(r"http listening on (http://\S+)")


@pytest.fixture(autouse=True)
def _no_back_off(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's failed attempts answered at once, but in the tests of the back-off itself (those
    that ask for ``back_off``): the tests of refusals make dozens of them, each slowed up to 2 s
    (35 s for one test on its own)."""
    if "back_off" not in request.fixturenames:
        monkeypatch.setattr(http_auth, "FREE_FAILURES", 10**9)


@pytest.fixture
def back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off as shipped (http/auth.py), its first delay 0.5 s: "slowed" and "at once"
    differ by more than a loaded machine's noise."""
    monkeypatch.setattr(http_auth, "FIRST_DELAY", 0.5)


def base_url(service: Service) -> str:
    assert service.http is not None, "the service was started without SCHEDULER_HTTP_PORT"
    return service.http.url


@pytest.fixture
async def serve(start_service: ServiceFactory) -> Callable[..., Any]:
    """Start an in-process service with HTTP on a port the kernel picks (``http_port=0``)."""

    async def start(jobs: Any, **overrides: Any) -> Service:
        overrides.setdefault("http_port", 0)
        return await start_service(jobs, **overrides)

    return start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def spawn(spawn: Spawn) -> Spawn:
    """Real ``slotcron run`` processes serving HTTP on a port of their choosing."""

    def start(name: str, jobs: str, **env: Any) -> Instance:
        env.setdefault("SCHEDULER_HTTP_PORT", 0)
        return spawn(name, jobs, **env)

    return start


def listening_url(instance: Instance, timeout: float = 20) -> str:
    """The URL a real process logged it listens on (it was told port 0)."""

    def found() -> str | None:
        if not instance.alive():
            raise AssertionError(f"{instance.name} exited: {instance.log()}")
        match = _LISTENING.search(instance.full_log())
        return match.group(1) if match else None

    url: str = wait_until(found, timeout, f"{instance.name} to listen for HTTP")
    return url
