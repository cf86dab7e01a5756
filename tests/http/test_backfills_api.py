"""``POST /api/jobs/{name}/backfill``, ``GET /api/backfills``, ``DELETE /api/backfills/{id}``,
and the client's ``backfill``: the same store as ``slotcron backfill``, the same refusals as HTTP
statuses, and the backfilled slots run by the instance serving them (judged by the job's own
record)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import aiohttp
import pytest
from slotcron import Client, JobContext
from slotcron.errors import Refused, UsageError
from slotcron.jobs.registry import Registry, cron

from tests.conftest import wait_for
from tests.http.conftest import TOKEN, auth, base_url
from tests.http.test_api import call

SPAN = {"from": "2020-01-01T00:00:00Z", "to": "2023-01-01T00:00:00Z"}
YEARS = ["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z", "2022-01-01T00:00:00Z"]


def yearly(ran: list[tuple[datetime, str]]) -> list[Any]:
    registry = Registry()

    @cron("0 0 1 1 *", name="bf.yearly", registry=registry)
    async def job(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, ctx.trigger))

    return list(registry)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_backfill_over_http_runs_and_is_listed_and_bad_requests_are_refused(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    ran: list[tuple[datetime, str]] = []
    service = await serve(yearly(ran), admin_token=TOKEN)
    base = base_url(service)
    url = f"{base}/api/jobs/bf.yearly/backfill"
    status, answer, _ = await call(client, "POST", url, json=SPAN)
    assert status == 401, "a write needs the admin token"
    status, answer, _ = await call(
        client, "POST", url, json={**SPAN, "dry_run": True}, headers=auth()
    )
    assert (status, answer["slots"], answer["count"]) == (200, YEARS, 3)
    refusals = {
        '{"from": "2021-01-01T00:00:00Z", "to": "2020-01-01T00:00:00Z"}': (400, "to", "not after"),
        '{"to": "2020-01-01T00:00:00Z"}': (400, "from", "from is required"),
        '{"from": "soon", "to": "2020-01-01T00:00:00Z"}': (400, "from", "ISO-8601"),
        '{"from": "2020-01-01T00:00:00Z", "to": "2021-01-01T00:00:00Z", "rate": -1}': (
            400, "rate", "between 0",
        ),
        '{"from": "2020-01-01T00:00:00Z", "to": "2021-01-01T00:00:00Z", "dry_run": 1}': (
            400, "dry_run", "true or false",
        ),
        '{"from": "2020-01-01T00:00:00Z", "to": "2021-01-01T00:00:00Z", "why": 1}': (
            400, "why", "why",
        ),
    }  # fmt: skip
    for data, (code, field, said) in refusals.items():
        status, answer, _ = await call(client, "POST", url, data=data, headers=auth())
        assert (status, answer.get("field")) == (code, field), (data, answer)
        assert said in answer["error"], answer
    status, answer, _ = await call(
        client, "POST", url.replace("bf.yearly", "nope"), json=SPAN, headers=auth()
    )
    assert status == 404 and "nope" in answer["error"]
    status, listed, _ = await call(client, "GET", f"{base}/api/backfills", headers=auth())
    assert (status, list(listed)) == (200, []), "a refused request wrote nothing"
    status, made, _ = await call(client, "POST", url, json={**SPAN, "rate": 0}, headers=auth())
    assert (status, made["slots"], made["status"]) == (201, 3, "RUNNING")
    await wait_for(lambda: len(ran) == 3, timeout=20, what="three backfilled years")
    assert sorted((s.isoformat(), t) for s, t in ran) == [
        (y.replace("Z", "+00:00"), "backfill") for y in YEARS
    ]

    async def completed() -> dict[str, Any] | None:
        _, found, _ = await call(client, "GET", f"{base}/api/backfills", headers=auth())
        listing: Any = found  # a JSON array here
        first: dict[str, Any] = listing[0]
        return first if first["status"] == "COMPLETED" else None

    done = await wait_for(completed, timeout=10, what="the backfill completed")
    assert (done["id"], done["done"], done["left"]) == (made["id"], 3, 0)
    gone = f"{base}/api/backfills/{made['id']}"
    status, answer, _ = await call(client, "DELETE", gone, headers=auth())
    assert status == 409 and "already COMPLETED" in answer["error"]
    for where, code in ((f"{base}/api/backfills/999", 404), (f"{base}/api/backfills/x", 400)):
        status, answer, _ = await call(client, "DELETE", where, headers=auth())
        assert status == code, answer


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_the_client_backfills_lists_and_cancels(serve: Any, db_url: str) -> None:
    ran: list[tuple[datetime, str]] = []
    service = await serve(yearly(ran))
    async with Client(db_url) as client:
        dry = await client.backfill("bf.yearly", SPAN["from"], SPAN["to"], dry_run=True)
        assert dry["slots"] == YEARS
        with pytest.raises(UsageError, match="start 'x'"):
            await client.backfill("bf.yearly", "x", SPAN["to"])
        await service.stop()  # nobody carries it on: it can be cancelled with its slots left
        made = await client.backfill("bf.yearly", SPAN["from"], SPAN["to"], rate=2)
        assert (made["slots"], made["left"]) == (3, 3)
        [listed] = await client.backfills()
        assert (listed["id"], listed["status"], listed["rate"]) == (made["id"], "RUNNING", 2.0)
        assert await client.cancel_backfill(made["id"]) == 0
        with pytest.raises(Refused, match="already CANCELLED"):
            await client.cancel_backfill(made["id"])
        [listed] = await client.backfills()
        assert (listed["status"], listed["note"], listed["left"]) == ("CANCELLED", "cancelled", 0)
    assert ran == []
