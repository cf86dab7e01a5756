"""``slotcron.Client``: schedules at runtime from an application (a sign-up handler, a settings
page).

```python
async with slotcron.Client("postgresql+asyncpg://...") as client:
    schedule = await client.add_schedule("reports.send", cron="0 9 * * *",
                                         timezone="Asia/Seoul", params={"tenant_id": 42})
```

It writes to the database directly, through the same checks and store as the CLI and the API
(:mod:`slotcron.store.schedules`): bad input raises :class:`slotcron.InvalidJobError` naming the
field and
writes nothing (an id already taken too, naming ``id``); an unknown id raises
:class:`slotcron.errors.NotFound`; updating or removing a ``@cron``/``@every`` job raises
:class:`slotcron.errors.Refused`. A task is known when this process registered it with ``@task`` or
an instance recorded it (see :mod:`slotcron.jobs.schedules`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from slotcron.clock import DatabaseClock
from slotcron.config import load_settings
from slotcron.errors import InvalidJobError, UsageError
from slotcron.filters import parse_instant
from slotcron.jobs.schedules import IdTaken, TaskInfo, schedule_json
from slotcron.store import backfills, skips
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.text import iso

POOL_SIZE = 2
PAGE = 1000


class Client:
    """An async context manager holding a small connection pool (:data:`POOL_SIZE`).
    ``timezone`` is the zone of schedules that give none and whose task declares none (default
    ``SCHEDULER_TIMEZONE``)."""

    def __init__(self, database_url: str, *, timezone: str | None = None) -> None:
        overrides: dict[str, Any] = {"database_url": database_url}
        if timezone is not None:
            overrides["timezone"] = timezone
        self._settings = load_settings(**overrides)
        self._db: Database | None = None
        self._clock: DatabaseClock | None = None
        self._tasks: dict[str, TaskInfo] = {}

    async def __aenter__(self) -> Client:
        self._db = Database.connect(
            self._settings.url, POOL_SIZE, create=False, pooler=self._settings.database_pooler
        )
        # Slots are computed by the database's clock, sampled once (and again after a step of
        # this machine's clock), not asked for at every write.
        self._clock = DatabaseClock(self._db.clock_sample)
        try:
            await self._clock.sync()
        except BaseException:
            await self._db.close()
            self._db = None
            raise
        return self

    async def _now(self) -> datetime:
        assert self._clock is not None
        if self._clock.wall_stepped():
            await self._clock.sync()
        return self._clock.now()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    @property
    def db(self) -> Database:
        if self._db is None:
            raise RuntimeError("use the client inside `async with Client(...) as client:`")
        return self._db

    async def add_schedule(
        self,
        task: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str | None = None,
        params: Mapping[str, Any] | None = None,
        id: str | None = None,
        jitter: float | None = None,
        paused: bool = False,
        **bounds: Any,
    ) -> dict[str, Any]:
        """Create a schedule of ``task`` (exactly one of ``cron`` and ``every``); returns it.
        ``bounds``: its own ``calendar``, ``exclude_dates``, ``start_at``, ``end_at`` and
        ``max_runs`` (its task's when not given), as on ``@cron``."""
        item: dict[str, Any] = {"task": task, "paused": paused, **bounds}
        given = {"cron": cron, "every": every, "timezone": timezone, "id": id, "jitter": jitter}
        item.update({k: v for k, v in given.items() if v is not None})
        if params is not None:
            item["params"] = params if not isinstance(params, Mapping) else dict(params)
        return (await self.add_schedules([item]))[0]

    async def add_schedules(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Create many schedules in one transaction, all or none (each a mapping with the
        keywords of :meth:`add_schedule`); returns them in order. An id already taken raises
        :class:`InvalidJobError` naming ``id``, as any bad input."""
        try:
            records = await store.create(
                self.db,
                list(items),
                default_timezone=self._settings.timezone,
                by="client",
                now=await self._now(),
                remembered=self._tasks,
            )
        except IdTaken as exc:
            raise InvalidJobError(exc.id, exc.field, exc.problem) from None
        return [schedule_json(r) for r in records]

    async def update_schedule(
        self,
        id: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str | None = None,
        params: Mapping[str, Any] | None = None,
        jitter: float | None = None,
        paused: bool | None = None,
        **bounds: Any,
    ) -> dict[str, Any]:
        """Change a schedule from its next slot; what is not given stays. Returns it.
        ``bounds``: its ``calendar``, ``exclude_dates``, ``start_at``, ``end_at``,
        ``max_runs``; one given as None is taken off."""
        given = {
            "cron": cron,
            "every": every,
            "timezone": timezone,
            "params": params if not isinstance(params, Mapping) else dict(params),
            "jitter": jitter,
            "paused": paused,
        }
        changes = {k: v for k, v in given.items() if v is not None} | bounds
        record = await store.update(self.db, id, changes, now=await self._now(), by="client")
        return schedule_json(record)

    async def remove_schedule(self, id: str) -> None:
        """Delete a schedule: no further slot of it runs; its history stays."""
        await store.remove(self.db, id, now=await self._now())

    async def get_schedule(self, id: str) -> dict[str, Any]:
        return schedule_json(await store.get(self.db, id))

    async def list_schedules(
        self, task: str | None = None, *, limit: int | None = None, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Schedules ordered by id (``task``'s only, when given); all of them unless ``limit``."""
        found: list[dict[str, Any]] = []
        while limit is None or len(found) < limit:
            page = PAGE if limit is None else min(PAGE, limit - len(found))
            records = await store.list_schedules(
                self.db, task=task, limit=page, offset=offset + len(found)
            )
            found.extend(schedule_json(r) for r in records)
            if len(records) < page:
                break
        return found

    async def skip(self, job: str, at: datetime | str, reason: str | None = None) -> dict[str, Any]:
        """Record slot ``at`` of ``job`` (a ``@cron``/``@every`` job or a schedule's id) to be
        ``SKIPPED`` with ``reason`` when it comes. ``at`` is aware, or UTC. A time that is not
        one of its slots raises :class:`slotcron.errors.UsageError`; a slot already decided,
        :class:`slotcron.errors.Refused`."""
        skipped = await skips.skip(
            self.db, job=job, at=_instant(at), reason=reason or None, now=await self._now()
        )
        return {"job": job, "at": iso(skipped.at), "reason": skipped.reason, "skipped": True}

    async def unskip(self, job: str, at: datetime | str) -> None:
        """Take back the skip of slot ``at`` of ``job`` while it has not come
        (:class:`slotcron.errors.Refused` once it is decided, or when it is not skipped)."""
        await skips.unskip(self.db, job=job, at=_instant(at))

    async def backfill(
        self,
        job: str,
        start: datetime | str,
        end: datetime | str,
        rate: float | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Run every slot of ``job`` in [``start``, ``end``) that never completed, once, oldest
        first, at most ``rate`` starts a second (default 10; 0: as fast as capacity allows), on
        the live instances. Returns the backfill (its ``id``), or with ``dry_run`` the slots it
        would run. Bad input raises :class:`slotcron.errors.UsageError`; a paused job,
        :class:`slotcron.errors.Refused`."""
        return await backfills.request(
            self.db,
            job=job,
            start=_instant(start, "start"),
            end=_instant(end, "end"),
            rate=rate,
            dry_run=dry_run,
            now=await self._now(),
            retention_days=self._settings.history_retention_days,
        )

    async def backfills(self) -> list[dict[str, Any]]:
        """The newest backfills first, with their progress."""
        return [b.as_dict() for b in await backfills.listing(self.db)]

    async def cancel_backfill(self, backfill_id: int) -> int:
        """Stop a backfill; returns how many of its queued runs were recorded SKIPPED."""
        return await backfills.cancel(self.db, backfill_id, now=await self._now())


def _instant(at: datetime | str, what: str = "at") -> datetime:
    if isinstance(at, str):
        try:
            return parse_instant(at)
        except ValueError as exc:
            raise UsageError(f"{what} {exc}") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
