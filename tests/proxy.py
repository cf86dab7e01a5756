"""A TCP proxy between a service and its database, which a test can cut or freeze.

``down``: refuse new connections and close the open ones (the database is gone).
``hang``: accept connections and forward nothing (the database is there but does not answer).
``freeze()``: forward nothing on any connection, open or new, in either direction, and lose
nothing: ``thaw()`` delivers what was held and goes on (a database path that stalls, then heals).
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.engine import make_url


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.mode = "up"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @classmethod
    def for_url(cls, url: str) -> Proxy:
        parsed = make_url(url)
        return cls(parsed.host or "127.0.0.1", int(parsed.port or 0))

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.mode == "hang":
            return  # held open, never answered
        await self._flowing.wait()  # a new connection hangs while frozen, and then connects
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while self.mode == "up":
                await self._flowing.wait()
                if not (data := await source.read(65536)):
                    break
                await self._flowing.wait()  # read just before a freeze: held, not lost
                if self.mode != "up":
                    return  # hung: the bytes are swallowed
                sink.write(data)
                await sink.drain()
        if self.mode != "hang":
            sink.close()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def down(self) -> None:
        self.mode = "down"
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._close_all()

    def freeze(self) -> None:
        """Stop forwarding bytes on every connection, open or new, both ways (nothing is lost)."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Forward again what was held, and everything after."""
        self._flowing.set()

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    async def hang(self) -> None:
        self.mode = "hang"

    async def up(self) -> None:
        """Forward again (open connections from before are closed: their state is unknown)."""
        self._close_all()
        self.mode = "up"
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        self.thaw()
        await self.down()
        for task in list(self._tasks):
            task.cancel()
