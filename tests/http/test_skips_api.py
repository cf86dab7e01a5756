"""``POST /api/jobs/{name}/skip`` and ``DELETE /api/jobs/{name}/skip?at=``, and the client's
``skip``/``unskip``: the same store as ``slotcron skip``, the same refusals as HTTP statuses."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from slotcron import Client
from slotcron.errors import Refused, UsageError
from slotcron.jobs.registry import Registry, cron
from slotcron.store import skips
from yarl import URL

from tests.http.conftest import TOKEN, auth, base_url
from tests.http.test_api import call

NEW_YEAR = "2031-01-01T00:00:00Z"


def yearly() -> list[Any]:
    registry = Registry()

    @cron("0 0 1 1 *", name="skip.yearly", registry=registry)
    async def job() -> None:
        pass

    return list(registry)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_skip_and_unskip_over_http_and_their_refusals(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(yearly(), admin_token=TOKEN)
    url = f"{base_url(service)}/api/jobs/skip.yearly/skip"
    body = {"at": NEW_YEAR, "reason": "holiday"}
    status, answer, _ = await call(client, "POST", url, json=body)
    assert status == 401, "a write needs the admin token"
    status, answer, _ = await call(client, "POST", url, json=body, headers=auth())
    assert (status, answer) == (
        201,
        {"job": "skip.yearly", "at": NEW_YEAR, "reason": "holiday", "skipped": True},
    )
    status, answer, _ = await call(client, "POST", url, json={"at": NEW_YEAR}, headers=auth())
    assert status == 200 and answer["reason"] is None, "skipped again: the reason is replaced"
    assert await skips.pending(service.db, "skip.yearly") != []
    refusals = {
        ("POST", url, '{"at": "2031-01-01T00:00:30Z"}'): (400, "at", "not a slot of skip.yearly"),
        ("POST", url, '{"at": "soon"}'): (400, "at", "expected an ISO-8601 time"),
        ("POST", url, "{}"): (400, "at", "at is required"),
        ("POST", url, '{"at": "' + NEW_YEAR + '", "why": 1}'): (400, "why", "why"),
        ("POST", url.replace("skip.yearly", "nope"), '{"at": "' + NEW_YEAR + '"}'): (
            404,
            "name",
            "nope",
        ),
    }
    for (method, where, data), (code, field, said) in refusals.items():
        status, answer, _ = await call(client, method, where, data=data, headers=auth())
        assert (status, answer.get("field")) == (code, field), (data, answer)
        assert said in answer["error"], answer
    unskip = URL(url).with_query(at=NEW_YEAR)
    status, answer, _ = await call(client, "DELETE", unskip, headers=auth())
    assert (status, answer["skipped"]) == (200, False)
    status, answer, _ = await call(client, "DELETE", unskip, headers=auth())
    assert status == 409 and "is not skipped" in answer["error"]
    assert await skips.pending(service.db, "skip.yearly") == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_the_client_skips_and_unskips(serve: Any, db_url: str) -> None:
    service = await serve(yearly())
    async with Client(db_url) as client:
        done = await client.skip("skip.yearly", NEW_YEAR, reason="closed")
        assert done == {"job": "skip.yearly", "at": NEW_YEAR, "reason": "closed", "skipped": True}
        [(at, reason)] = await skips.pending(service.db, "skip.yearly")
        assert (at.isoformat(), reason) == ("2031-01-01T00:00:00+00:00", "closed")
        with pytest.raises(UsageError, match="not a slot"):
            await client.skip("skip.yearly", "2031-01-01T00:01:00Z")
        with pytest.raises(UsageError, match="expected an ISO-8601 time"):
            await client.skip("skip.yearly", "tomorrow")
        await client.unskip("skip.yearly", at)
        with pytest.raises(Refused, match="is not skipped"):
            await client.unskip("skip.yearly", at)
    assert await skips.pending(service.db, "skip.yearly") == []
