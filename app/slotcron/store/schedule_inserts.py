"""New schedules written fast: one multi-row INSERT per page of rows, its SQL compiled once per
page size, each distinct value processed once (a batch of 100,000 schedules shares its task's
options, its timestamps and most next slots)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select

from slotcron.jobs.schedules import ScheduleRecord, ScheduleSpec, TaskInfo, task_bounds
from slotcron.store.database import Database
from slotcron.store.tables import jobs

_INSERTED = (
    jobs.c.name,
    jobs.c.task,
    jobs.c.kind,
    jobs.c.schedule,
    jobs.c.timezone,
    jobs.c.options,
    jobs.c.params,
    jobs.c.jitter,
    jobs.c.paused,
    jobs.c.next_slot_at,
    jobs.c.registered_at,
    jobs.c.updated_at,
    jobs.c.updated_by,
    jobs.c.fencing_token,
    jobs.c.fingerprint,
)
"""The columns a new schedule sets; the others keep their defaults (NULL)."""
PAGES = (256, 64, 16, 4, 1)
"""The sizes of multi-row INSERT used: a batch is cut into these, so a process compiles at most
five statements, each once (compiling costs by the row: a 1,000-row page cost a batch's client
more than the 4 times as many round trips of 256-row pages)."""


def options_of(spec: ScheduleSpec, task_options: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a schedule's row stores as its ``options``: its task's, with its own bounds (the
    task's very object when the schedule has its task's: a batch's rows share it, and it is
    written out once)."""
    if spec.bounds == task_bounds(task_options):
        return task_options
    return {**task_options, **spec.bounds}


def changed_options(
    stored: Any, current: ScheduleSpec, spec: ScheduleSpec
) -> dict[str, Mapping[str, Any]]:
    """The ``options`` to write when an update changed a schedule's bounds (``stored``: the
    row's, as its JSON text or decoded), as ``{"options": ...}``; nothing when they did not."""
    if spec.bounds == current.bounds:
        return {}
    options = json.loads(stored) if isinstance(stored, str) else dict(stored or {})
    return {"options": {**options, **spec.bounds}}


def insert_row(record: ScheduleRecord, task: TaskInfo, by: str, mark: str) -> tuple[Any, ...]:
    spec = record.spec
    return (
        spec.id,
        spec.task,
        spec.kind,
        spec.expression,
        spec.timezone,
        options_of(spec, task.options),
        spec.params,
        spec.jitter,
        spec.paused,
        record.next_slot,
        record.created_at,
        record.updated_at,
        by,
        0,
        mark,
    )


async def insert_rows(conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    """One multi-row INSERT per page of rows. The statement of each page size is compiled once
    (SQLAlchemy compiles a ``.values()`` list anew each time, and its per-row machinery costs
    more than the database's insert); values still pass through each column type's own
    processor (UTC timestamps, JSON), so every dialect gets what it expects."""
    dialect = conn.dialect
    start = 0
    while start < len(rows):
        size = next(p for p in PAGES if p <= len(rows) - start)
        sql, order, processors = _page(dialect, size)
        flat: list[Any] = []
        # Rows of a batch share many values (the task's options, the timestamps, the next
        # slot of a zone): each distinct object is processed once, not once a row.
        last: list[tuple[Any, Any]] = [(_NOTHING, None)] * len(processors)
        for row in rows[start : start + size]:
            for column, value in enumerate(row):
                process = processors[column]
                if process is None:
                    flat.append(value)
                    continue
                seen, done = last[column]
                if value is not seen:
                    done = process(value)
                    last[column] = (value, done)
                flat.append(done)
        await conn.exec_driver_sql(sql, flat if order is None else tuple(flat[i] for i in order))
        start += size


_NOTHING = object()


@functools.lru_cache(maxsize=32)
def _page(dialect: Any, size: int) -> tuple[str, tuple[int, ...] | None, tuple[Any, ...]]:
    """The SQL of an INSERT of ``size`` rows for ``dialect``; where its parameters go in the
    row-major list of values (None: in that order); and each column's bind processor."""
    width = len(_INSERTED)
    statement = insert(jobs).values(
        [
            {c.name: bindparam(f"r{number}_{i}", type_=c.type) for i, c in enumerate(_INSERTED)}
            for number in range(size)
        ]
    )
    compiled = statement.compile(dialect=dialect)
    order = tuple(
        int(number) * width + int(i)
        for number, i in (name[1:].split("_") for name in compiled.positiontup or ())
    )
    processors = tuple(c.type.dialect_impl(dialect).bind_processor(dialect) for c in _INSERTED)
    return compiled.string, None if order == tuple(range(size * width)) else order, processors


CHUNK = 1000
"""Ids per ``IN (...)`` list."""


async def taken_ids(db: Database, ids: Sequence[str]) -> list[str]:
    """Which of ``ids`` a job or a schedule holds already (why a batch's INSERT failed)."""
    taken: set[str] = set()
    for start in range(0, len(ids), CHUNK):
        async with db.read() as conn:
            rows = await conn.execute(
                select(jobs.c.name).where(jobs.c.name.in_(ids[start : start + CHUNK]))
            )
            taken.update(r.name for r in rows)
    return [i for i in ids if i in taken]
