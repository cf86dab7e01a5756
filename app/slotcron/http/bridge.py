"""The HTTP thread's way into the service's event loop.

The HTTP server runs on a loop of its own; the service's database engine, its probes and its
metrics belong to the service's loop. A handler hands work over with :meth:`call`: the
coroutine runs there and its result (or exception) comes back here. A handler that touches
``instance.db`` directly would use another loop's connections: reads use the admin pool
(:class:`~slotcron.http.reads.AdminReads`), everything else goes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ServiceBridge:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the service's loop (directly, when already on it)."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
