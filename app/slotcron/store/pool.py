"""The connection pool: SQLAlchemy's, giving back what an idle instance does not use.

SQLAlchemy's queue pool keeps every connection it ever opened until it is disposed of. Behind
a session pooler (PgBouncer's ``pool_mode = session``) each of them pins one of the pooler's few
server connections for good: three instances with ten connections each exhausted PgBouncer's
default pool of 20, and a fourth never started. The pool is LIFO, so an idle instance's few
statements keep to the connections returned last, and the others only age:
:meth:`SheddingPool.shed_idle` closes those.
"""

from __future__ import annotations

import time

from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry
from sqlalchemy.util import queue as sqla_queue

IDLE_SINCE = "slotcron_idle_since"


class SheddingPool(AsyncAdaptedQueuePool):
    """A LIFO queue pool whose connections idle past a bound can be closed."""

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        record.info[IDLE_SINCE] = time.monotonic()
        super()._do_return_conn(record)

    def shed_idle(self, idle_for: float, keep: int = 1) -> int:
        """Close the pooled connections returned more than ``idle_for`` seconds ago, keeping
        the ``keep`` returned last. Call it from a greenlet (``greenlet_spawn``): closing a
        connection awaits its driver. Returns how many were closed."""
        waiting: list[ConnectionPoolEntry] = []
        while True:
            try:
                waiting.append(self._pool.get_nowait())  # the one returned last comes first
            except sqla_queue.Empty:
                break
        now = time.monotonic()
        kept: list[ConnectionPoolEntry] = []
        idle: list[ConnectionPoolEntry] = []
        for rank, record in enumerate(waiting):
            fresh = now - record.info.get(IDLE_SINCE, now) < idle_for
            (kept if rank < keep or fresh else idle).append(record)
        # Back in the order they were, before anything awaits: the last returned on top.
        for record in reversed(kept):
            self._pool.put_nowait(record)
        for record in idle:
            self._dec_overflow()  # the pool may open another in its place when asked
            record.close()
        return len(idle)
