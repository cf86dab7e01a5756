"""The admin plane's read cache is bounded by bytes, not by entries (issue 26, item 9): pages of
schedules holding 64 KB params each cannot pile up gigabytes, an answer larger than a quarter
of the bound is never kept, and answers nothing serves any more (older than a second) go first.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from aiohttp.test_utils import make_mocked_request
from slotcron.http import reads
from slotcron.http.reads import CACHE_BYTES, FRESH_SECONDS, MAX_CACHED_ANSWER, AdminReads

PARAMS = "x" * 64 * 1024  # a schedule's params at their largest


class _Pool:
    """Stands for the admin pool: these tests never reach a database."""

    def sibling(self, pool_size: int) -> _Pool:
        return self

    async def close(self) -> None:
        return None


def admin_reads() -> AdminReads:
    return AdminReads(_Pool())  # type: ignore[arg-type]


def page(schedules: int) -> Any:
    async def produce(db: Any) -> dict[str, Any]:
        return {"schedules": [{"id": f"s-{i}", "params": {"p": PARAMS}} for i in range(schedules)]}

    return produce


async def read(cache: AdminReads, key: str, produce: Any) -> bytes:
    response = await cache.respond(make_mocked_request("GET", f"/{key}"), key, produce)
    assert response.status == 200
    assert response.body is not None
    return bytes(response.body)  # type: ignore[arg-type]


async def test_thirty_six_pages_of_large_params_keep_at_most_the_byte_bound() -> None:
    cache = admin_reads()
    served = 0
    for offset in range(36):
        # 100 schedules of 64 KB: 6.6 MB a page, under the largest answer kept.
        served += len(await read(cache, f"schedules?offset={offset}", page(100)))
    assert served > 200 * 1024 * 1024, "the pages were served whole"
    assert cache.kept_bytes <= CACHE_BYTES
    assert cache.kept_bytes > CACHE_BYTES // 2, "it still keeps what fits"
    assert len(cache._answers) <= CACHE_BYTES // (len(PARAMS) * 100)


async def test_an_answer_larger_than_a_quarter_of_the_bound_is_served_but_never_kept() -> None:
    cache = admin_reads()
    await read(cache, "small", page(1))
    kept = cache.kept_bytes
    body = await read(cache, "schedules?limit=500", page(500))  # 32 MB
    assert len(body) > MAX_CACHED_ANSWER
    assert json.loads(body)["schedules"][499]["id"] == "s-499"
    assert cache.kept_bytes == kept, "the large answer was not kept"
    assert "small" in cache._answers, "nor did it push a small one out"


async def test_concurrent_identical_reads_share_one_query_even_when_it_is_not_kept() -> None:
    cache = admin_reads()
    queries = 0

    async def produce(db: Any) -> dict[str, Any]:
        nonlocal queries
        queries += 1
        await asyncio.sleep(0.2)
        answer: dict[str, Any] = await page(500)(db)
        return answer

    bodies = await asyncio.gather(*(read(cache, "big", produce) for _ in range(10)))
    assert queries == 1 and len(set(bodies)) == 1
    assert cache.kept_bytes == 0


async def test_answers_older_than_a_second_go_first_and_a_write_forgets_them_all(
    monkeypatch: Any,
) -> None:
    cache = admin_reads()
    now = [1000.0]
    monkeypatch.setattr(reads, "time", SimpleNamespace(monotonic=lambda: now[0]))
    await read(cache, "a", page(2))
    await read(cache, "b", page(2))
    now[0] += FRESH_SECONDS + 0.5
    await read(cache, "c", page(2))
    assert list(cache._answers) == ["c"], "stale answers serve nothing: dropped"
    cache.forget()
    assert cache.kept_bytes == 0 and not cache._answers
