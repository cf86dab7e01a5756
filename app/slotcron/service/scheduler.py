"""slotcron inside an application: :class:`Scheduler`, and ``slotcron run`` built on it.

Embedded (``async with Scheduler(...)``) the scheduler is a guest of the process: it installs
no signal handler, configures no logging (it logs to the ``slotcron.*`` loggers, for the
application to route), leaves the garbage collector alone, serves HTTP only when ``http_port``
is given to it, and fails at once when the database cannot be reached (the application decides
whether to retry). ``slotcron run`` owns its process: :meth:`Scheduler.run` adds SIGTERM/SIGINT
handling, the collector's tuning and waiting out a database that is not up yet; its HTTP
server and its logging come from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from slotcron.config import Settings, load_settings
from slotcron.jobs.registry import REGISTRY

if TYPE_CHECKING:
    from slotcron.observe.events import Hook
    from slotcron.service.service import Service

log = logging.getLogger("slotcron.service")


class Scheduler:
    """One slotcron instance inside an application::

        async with Scheduler(jobs=["myapp.jobs"], database_url="postgresql+asyncpg://…"):
            ...  # the application runs; leaving runs the phased shutdown

    ``jobs``: modules to import, besides those ``SCHEDULER_JOBS`` names (as ``--jobs`` adds to
    it); every job registered by the time the scheduler starts runs, wherever it was declared.
    ``hooks``: :class:`~slotcron.Hook` instances, besides those ``SCHEDULER_HOOKS`` names.
    ``settings``: the configuration's fields by name, lower case (``database_url``,
    ``max_concurrency``, ...); the rest is read from the environment as ``slotcron run`` reads
    it, except ``SCHEDULER_HTTP_PORT``: an embedded scheduler serves HTTP only when given
    ``http_port``. A misspelt name or a bad value raises :class:`~slotcron.errors.ConfigError`
    naming it.

    Entering returns once the scheduler runs, or raises
    :class:`~slotcron.errors.DatabaseUnreachable` (naming host and port) within the connect
    timeout when the database cannot be reached. Leaving runs the phased shutdown: claiming
    stops, runs in flight get ``SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT`` to finish, the rest are
    cancelled and recorded ``STOPPED``.
    """

    def __init__(
        self, *, jobs: Iterable[str] = (), hooks: Iterable[Hook] = (), **settings: Any
    ) -> None:
        resolved = load_settings(**settings)
        if "http_port" not in settings:
            # SCHEDULER_HTTP_PORT is the service's: it opens no port inside someone's application.
            resolved = resolved.model_copy(update={"http_port": None})
        self._prepare(resolved, jobs, hooks)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, jobs: Iterable[str] = (), hooks: Iterable[Hook] = ()
    ) -> Scheduler:
        """The scheduler of settings already read, HTTP included (``slotcron run``'s)."""
        scheduler = cls.__new__(cls)
        scheduler._prepare(settings, jobs, hooks)
        return scheduler

    def _prepare(self, settings: Settings, jobs: Iterable[str], hooks: Iterable[Hook]) -> None:
        self.settings = settings
        for module in dict.fromkeys([*settings.jobs, *jobs]):
            importlib.import_module(module)  # an error is the application's, traceback and all
        self._hooks = list(hooks)  # the service adds SCHEDULER_HOOKS's (assemble.observing)
        self._service: Service | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def service(self) -> Service:
        """The instance, once entered (its state, its HTTP server: for inspection)."""
        if self._service is None:
            raise RuntimeError("the scheduler is not running")
        return self._service

    @property
    def exit_status(self) -> int:
        """1 once another process took this instance's id over (it then stopped), else 0."""
        return self._service.exit_status if self._service is not None else 0

    def _assemble(self) -> Service:
        from slotcron.service.service import Service  # the engine is loaded when it is used

        if self._service is not None:
            raise RuntimeError("a Scheduler runs once: make a new one to run again")
        self._service = Service(self.settings, list(REGISTRY), hooks=self._hooks)
        return self._service

    async def __aenter__(self) -> Scheduler:
        service = self._assemble()
        try:
            await service.start(patient=False)
        except BaseException:
            self._service = None
            await service.db.close()
            raise
        self._watch = asyncio.create_task(self._stop_when_asked(service))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        service, watch = self.service, self._watch
        if service.signals.requested.is_set() and watch is not None:
            await watch  # it is shutting down already (our id was taken)
        else:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await service.stop()
        self._watch = None

    async def _stop_when_asked(self, service: Service) -> None:
        """Shut down without waiting for the application when the service asks for it (another
        process took our instance id over: nothing here may write as that id any more)."""
        await service.signals.requested.wait()
        log.error(
            "instance %s: its id was taken over by another process; the scheduler stopped",
            service.instance_id,
        )
        await service.stop()

    async def run(self) -> bool:
        """``slotcron run``: the scheduler as the process's own, until SIGTERM or SIGINT (a
        second one skips the drain). Waits out a database that cannot be reached yet, then
        tunes the garbage collector (:func:`~slotcron.service.service.tune_gc`). False when
        some run ignored cancellation and is still alive (the caller must then exit without
        awaiting it); the exit status is :attr:`exit_status`."""
        from slotcron.service.service import tune_gc

        service = self._assemble()
        signals = service.signals
        signals.install()
        opening = asyncio.create_task(service.open(signals.requested))
        requested = asyncio.create_task(signals.requested.wait())
        await asyncio.wait({opening, requested}, return_when=asyncio.FIRST_COMPLETED)
        if not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening  # lets it stop the HTTP server
            await service.db.close()
            log.info("stopped before start-up completed")
            return True
        opening.result()
        tune_gc()
        await service.begin()
        await requested
        await service.stop(signals)
        return len(service.runs) == 0
