"""``/api/schedules`` on an in-process service with HTTP, on every backend (issue 15): the
contract's paths, codes and shapes, the token on writes, and bad input refused with nothing
written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, cron, task
from slotcron.store import schedules as store
from slotcron.store.database import Database
from yarl import URL

from tests.corrupt import BIG_NUMBER, corrupt
from tests.http.conftest import TOKEN, auth, base_url

TASK = "api.send_report"
CODE_JOB = "api.code-job"


def registry() -> Registry:
    jobs = Registry()

    @cron("0 0 1 1 *", name=CODE_JOB, registry=jobs)
    async def code_job() -> None:
        pass

    @task(name=TASK, registry=jobs)
    async def send_report(ctx: JobContext) -> None:
        pass

    return jobs


async def start(db: Database, serve: Any) -> str:
    jobs = registry()
    # What an instance of the task code records at its start.
    await store.register_tasks(
        db, jobs.tasks(), now=datetime.now(UTC), instance_id="t", version="0"
    )
    service = await serve(list(jobs), admin_token=TOKEN)
    return base_url(service)


async def call(
    client: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    json: Any = None,
    *,
    token: str | None = TOKEN,
) -> tuple[int, Any]:
    headers = auth(token) if token is not None else {}
    async with client.request(method, url, json=json, headers=headers) as response:
        if response.status == 204:
            assert await response.read() == b""
            return 204, None
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def test_schedules_are_created_listed_read_patched_and_deleted_over_http(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {"task": TASK, "cron": "0 9 * * *", "timezone": "Asia/Seoul", "params": {"t": 1}}
    status, created = await call(client, "POST", f"{url}/api/schedules", body)
    assert status == 201, created
    assert created["id"].startswith(f"{TASK}/") and created["next_slot"].endswith("T00:00:00Z")
    for i in range(3):
        status, _ = await call(
            client, "POST", f"{url}/api/schedules", {"task": TASK, "every": 60, "id": f"t/{i}"}
        )
        assert status == 201

    status, page = await call(client, "GET", URL(f"{url}/api/schedules").with_query(limit=2))
    assert status == 200
    assert [s["id"] for s in page["schedules"]] == [created["id"], "t/0"]
    assert (page["limit"], page["offset"], page["next_offset"]) == (2, 0, 2)
    query = URL(f"{url}/api/schedules").with_query(task=TASK, limit=2, offset=2)
    status, last = await call(client, "GET", query)
    assert [s["id"] for s in last["schedules"]] == ["t/1", "t/2"] and last["next_offset"] is None

    one = f"{url}/api/schedules/{quote('t/1', safe='')}"
    status, got = await call(client, "GET", one, token=TOKEN)
    assert status == 200 and got["id"] == "t/1" and got["every"] == 60
    status, patched = await call(client, "PATCH", one, {"cron": "*/5 * * * *", "params": {"a": 2}})
    assert status == 200 and patched["cron"] == "*/5 * * * *" and patched["params"] == {"a": 2}
    status, _ = await call(client, "DELETE", one)
    assert status == 204
    status, gone = await call(client, "GET", one)
    assert status == 404 and gone["field"] == "id"
    assert "t/1" not in [r.spec.id for r in await store.list_schedules(db)]


async def test_writes_need_the_token(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {"task": TASK, "every": 5, "id": "guarded"}
    assert (await call(client, "POST", f"{url}/api/schedules", body, token=None))[0] == 401
    assert (await call(client, "POST", f"{url}/api/schedules", body, token="wrong"))[0] == 403
    assert await store.list_schedules(db) == []
    assert (await call(client, "POST", f"{url}/api/schedules", body))[0] == 201
    for method in ("PATCH", "DELETE"):
        status, _ = await call(client, method, f"{url}/api/schedules/guarded", {}, token=None)
        assert status == 401
    assert [r.spec.id for r in await store.list_schedules(db)] == ["guarded"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "api.unknown", "every": 5}, "task"),
        ({"task": TASK, "cron": "0 25 * * *"}, "cron"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "Atlantis/Capital"}, "timezone"),
        ({"task": TASK, "every": 0}, "every"),
        ({"task": TASK, "every": 5, "params": "tenant=1"}, "params"),
        ({"task": TASK, "every": 5, "jitter": -2}, "jitter"),
        ({"task": TASK, "every": 5, "when": "now"}, "when"),
        # Issue 26: the limits (a zone that is not one answered 503 with the install path).
        ({"task": TASK, "every": 0.001}, "every"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "America"}, "timezone"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": ""}, "timezone"),
        ({"task": TASK, "every": 5, "id": "tenant\n42 audit: forged"}, "id"),
        ({"task": TASK, "every": 5, "id": "tenant\x9b2J"}, "id"),
        ({"task": TASK, "every": 5, "params": {"n": 10**64}}, "params"),
        # (Params past 64 KB cannot arrive: a body is at most 64 KB, 413.)
    ],
)
async def test_bad_input_is_400_naming_the_field_and_writes_nothing(
    db: Database, serve: Any, client: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    url = await start(db, serve)
    status, answer = await call(client, "POST", f"{url}/api/schedules", body)
    assert (status, answer.get("field")) == (400, field), answer
    assert "site-packages" not in answer["error"] and "zoneinfo" not in answer["error"]
    assert await store.list_schedules(db) == []


async def test_an_id_already_taken_is_409_naming_id_and_holds_no_other_rows_data(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {"task": TASK, "every": 60, "id": "Tenant/Alpha", "params": {"key": "secret-alpha"}}
    assert (await call(client, "POST", f"{url}/api/schedules", body))[0] == 201
    for taken in ("Tenant/Alpha", CODE_JOB):
        again = {"task": TASK, "every": 60, "id": taken, "params": {"mine": 1}}
        status, answer = await call(client, "POST", f"{url}/api/schedules", again)
        assert (status, answer.get("field")) == (409, "id"), answer
        assert "already taken" in answer["error"] and "secret" not in answer["error"]
    [stored] = await store.list_schedules(db)
    assert stored.spec.params == {"key": "secret-alpha"}


async def test_an_ids_case_accent_and_space_variants_reach_only_themselves(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    """Issue 26, item 4: on MariaDB, ``/api/schedules/tenant%2Falpha`` read, overwrote and
    deleted ``Tenant/Alpha``."""
    url = await start(db, serve)
    body = {"task": TASK, "every": 60, "id": "Tenant/Alpha", "params": {"key": "alpha"}}
    assert (await call(client, "POST", f"{url}/api/schedules", body))[0] == 201
    for variant in ("tenant/alpha", "Ténant/Alpha", "Tenant/Alpha "):
        one = f"{url}/api/schedules/{quote(variant, safe='')}"
        assert (await call(client, "GET", one))[0] == 404
        assert (await call(client, "PATCH", one, {"params": {"key": "overwritten"}}))[0] == 404
        assert (await call(client, "DELETE", one))[0] == 404
        created = {**body, "id": variant, "params": {"key": variant}}
        assert (await call(client, "POST", f"{url}/api/schedules", created))[0] == 201
        status, got = await call(client, "GET", one)
        assert (status, got["id"], got["params"]) == (200, variant, {"key": variant})
    status, original = await call(client, "GET", f"{url}/api/schedules/Tenant%2FAlpha")
    assert (status, original["params"]) == (200, {"key": "alpha"})
    assert len(await store.list_schedules(db)) == 4


async def test_a_path_id_with_a_control_character_is_400_naming_id(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    for method in ("GET", "PATCH", "DELETE"):
        for encoded in ("a%1B%5B2Jb", "a%7Fb", "a%C2%85b"):
            status, answer = await call(client, method, f"{url}/api/schedules/{encoded}", {})
            assert (status, answer.get("field")) == (400, "id"), answer


async def test_an_unreadable_row_is_listed_with_its_error_and_the_page_is_served(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    """Issue 26, item 8: one row a writer outside slotcron broke made every listing 500."""
    url = await start(db, serve)
    for name in ("a-good", "b-broken", "c-good"):
        body = {"task": TASK, "every": 60, "id": name, "params": {"n": 1}}
        assert (await call(client, "POST", f"{url}/api/schedules", body))[0] == 201
    await corrupt(db, "b-broken", params=BIG_NUMBER)
    status, page = await call(client, "GET", f"{url}/api/schedules")
    assert status == 200, page
    listed = {s["id"]: s for s in page["schedules"]}
    assert listed["a-good"]["params"] == {"n": 1} and "error" not in listed["a-good"]
    assert listed["b-broken"]["params"] is None
    assert listed["b-broken"]["error"].startswith("params: ")
    assert "7777777" not in listed["b-broken"]["error"]
    status, one = await call(client, "GET", f"{url}/api/schedules/b-broken")
    assert status == 200 and one["error"] == listed["b-broken"]["error"]
    # Mended by a write that gives what could not be read; refused while it does not.
    status, answer = await call(client, "PATCH", f"{url}/api/schedules/b-broken", {"every": 120})
    assert (status, answer.get("field")) == (400, "params"), answer
    patch = {"params": {"n": 2}}
    status, mended = await call(client, "PATCH", f"{url}/api/schedules/b-broken", patch)
    assert status == 200 and mended["params"] == {"n": 2} and "error" not in mended


async def test_a_code_job_is_409_and_an_unknown_id_404(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    code_job = f"{url}/api/schedules/{CODE_JOB}"
    assert (await call(client, "PATCH", code_job, {"every": 5}))[0] == 409
    assert (await call(client, "DELETE", code_job))[0] == 409
    assert (await call(client, "GET", code_job))[0] == 404
    status, answer = await call(client, "PATCH", f"{url}/api/schedules/nope", {"every": 5})
    assert (status, answer["field"]) == (404, "id")
    status, answer = await call(client, "PATCH", f"{url}/api/schedules/nope", {"task": "x"})
    assert (status, answer["field"]) == (400, "task")


async def test_a_schedules_own_bounds_over_http(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {
        "task": TASK, "every": 60, "id": "bounded", "calendar": "holidays:US-NY",
        "exclude_dates": ["2031-12-24"], "end_at": "2031-12-31T00:00:00Z", "max_runs": 10,
    }  # fmt: skip
    status, created = await call(client, "POST", f"{url}/api/schedules", body)
    assert status == 201, created
    assert (created["calendar"], created["exclude_dates"], created["max_runs"]) == (
        "holidays:US-NY",
        ["2031-12-24"],
        10,
    )
    assert created["end_at"] == "2031-12-31T00:00:00+00:00" and created["start_at"] is None
    where = f"{url}/api/schedules/bounded"
    status, answer = await call(client, "PATCH", where, {"calendar": "holidays:US-QQ"})
    assert (status, answer.get("field")) == (400, "calendar"), answer
    status, patched = await call(client, "PATCH", where, {"calendar": None, "max_runs": None})
    assert status == 200 and (patched["calendar"], patched["max_runs"]) == (None, None)
    assert patched["exclude_dates"] == ["2031-12-24"]
