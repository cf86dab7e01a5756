"""Graceful shutdown in four phases, each with its own timeout.

1. Stop claiming slots; mark the instance ``draining``; hand runs whose body has not started
   (claimed ahead of their slot) back to the queue, for another instance to run.
2. Await in-flight runs, up to ``SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT``.
3. Cancel what is left, await up to ``SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT``; those runs are
   recorded ``STOPPED`` and their leases released.
4. Mark the instance ``stopped``; close the database.

A second signal skips to phase 3 (``hurry``). What shutdown reads and stops of the instance is
:class:`Stopping`, not the whole service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from slotcron.instance import Identity
from slotcron.lifeline.inflight import CancelReason
from slotcron.lifeline.outage import DB_ERRORS, describe
from slotcron.status import InstanceState
from slotcron.store import lifeline, registrations
from slotcron.store import runs as run_store

if TYPE_CHECKING:
    from slotcron.lifeline.inflight import Runs
    from slotcron.lifeline.roles import Stoppable

log = logging.getLogger("slotcron.shutdown")


class _Stops(Protocol):
    async def stop(self) -> None: ...


class _Queue(Protocol):
    async def request_stop(self) -> None: ...


class _Kickoff(Protocol):
    closing: bool
    """No body starts once it is set."""


class _Runner(Protocol):
    @property
    def kickoff(self) -> _Kickoff: ...


class Stopping(Identity, Protocol):
    """What shutdown needs of the instance it stops (the service is one)."""

    state: str

    @property
    def id_taken(self) -> bool: ...
    @property
    def runs(self) -> Runs: ...
    @property
    def runner(self) -> _Runner: ...
    @property
    def queued(self) -> _Queue: ...
    @property
    def claiming(self) -> Sequence[Stoppable]:
        """Stopped in phase 1, in order: whatever starts new runs or decides slots."""
        ...

    @property
    def keeping(self) -> Sequence[Stoppable]:
        """Stopped in phase 4, in order: what in-flight runs needed to the end."""
        ...

    @property
    def events(self) -> _Stops:
        """Stopped in phase 4, after the runs: hooks and alerts send what is queued."""
        ...

    @property
    def http(self) -> _Stops | None: ...


class Signals:
    """SIGTERM/SIGINT: the first asks for a graceful shutdown, the second hurries it."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()
        self.count = 0

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.receive, sig)

    def receive(self, sig: int = signal.SIGTERM) -> None:
        self.count += 1
        name = signal.Signals(sig).name
        if self.count == 1:
            log.info("%s received: shutting down (a second signal skips the drain)", name)
            self.requested.set()
        else:
            log.warning("%s received again: cancelling in-flight runs now", name)
            self.hurry.set()


async def _wait_runs(service: Stopping, timeout: float, hurry: asyncio.Event) -> bool:
    """Wait until no run is in flight, ``timeout`` passes, or ``hurry`` is set. True if empty."""
    empty = asyncio.create_task(service.runs.wait_empty())
    hurried = asyncio.create_task(hurry.wait())
    try:
        await asyncio.wait({empty, hurried}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        empty.cancel()
        hurried.cancel()
    return len(service.runs) == 0


async def _hand_back_unstarted(service: Stopping) -> None:
    """Runs claimed here whose body has not started (claimed ahead of their slot, say) go back
    to the queue at once, for a live instance to run at their time: a stopping instance starts
    no new body, and records nothing it never ran."""
    unstarted = {h.id: h for h in service.runs if not h.started and h.cancel_reason is None}
    if not unstarted:
        return
    try:
        back = await lifeline.hand_back_mine(
            service.db,
            list(unstarted),
            instance_id=service.instance_id,
            now=service.clock.now(),
        )
    except DB_ERRORS as exc:
        # Their leases lapse unrenewed once we are gone, and the leader hands them back.
        log.warning("could not hand back %d unstarted runs: %s", len(unstarted), describe(exc))
        return
    for execution_id in back:
        service.runs.cancel(unstarted[execution_id], CancelReason.HANDED_BACK)
    if back:
        log.info("phase 1: handed back %d runs not yet started, for another instance", len(back))


async def shut_down(service: Stopping, hurry: asyncio.Event | None = None) -> None:
    """The four phases; ``hurry`` (a second signal) skips the drain. Nothing here depends on
    a signal: an embedded scheduler shuts down the same way when its application leaves it."""
    hurry = hurry or asyncio.Event()
    settings = service.settings
    await _stop_claiming(service)
    # Phase 2
    if not hurry.is_set() and len(service.runs):
        log.info("phase 2: draining for up to %g s", settings.shutdown_drain_timeout)
        await _wait_runs(service, settings.shutdown_drain_timeout, hurry)
    await _cancel_the_rest(service)
    await _close(service)


async def _stop_claiming(service: Stopping) -> None:
    """Phase 1."""
    service.state = InstanceState.DRAINING
    # No body starts from now on: runs claimed ahead of their slot go back to the queue first
    # thing (a slot may come while the claiming roles stop), and again once they have stopped.
    service.runner.kickoff.closing = True
    # The queue takes nothing more: not even the runs just handed back (their notification
    # would wake it).
    await service.queued.request_stop()
    await _hand_back_unstarted(service)
    for role in service.claiming:
        await role.stop()
    with contextlib.suppress(*DB_ERRORS):
        if not service.id_taken:  # else the row is another process's
            await registrations.set_instance_state(
                service.db,
                instance_id=service.instance_id,
                state=InstanceState.DRAINING,
                now=service.clock.now(),
            )
    log.info("phase 1: claiming stopped; %d runs in flight", len(service.runs))
    await _hand_back_unstarted(service)


async def _cancel_the_rest(service: Stopping) -> None:
    """Phase 3."""
    left = [h for h in service.runs if not h.finishing]  # the others are writing outcomes
    if left:
        log.warning(
            "phase 3: cancelling %d runs: %s",
            len(left),
            ", ".join(f"{h.job.name}#{h.id}" for h in left),
        )
        for handle in left:
            service.runs.cancel(handle, CancelReason.SHUTDOWN)
    if not len(service.runs):
        return
    await _wait_runs(service, service.settings.shutdown_cancel_timeout, asyncio.Event())
    stubborn = [h for h in service.runs if not h.finishing]
    if stubborn:
        # These ignored cancellation: record them STOPPED ourselves before we go.
        with contextlib.suppress(*DB_ERRORS):
            await run_store.stop_all(
                service.db,
                runs=[h.claim.key for h in stubborn],
                instance_id=service.instance_id,
                now=service.clock.now(),
                reason=f"stopped by shutdown of instance {service.instance_id} "
                "(did not end within the cancel timeout)",
            )


async def _close(service: Stopping) -> None:
    """Phase 4."""
    for role in service.keeping:
        await role.stop()  # the heartbeat first: a late beat must not undo "stopped"
    service.state = InstanceState.STOPPED
    try:
        if not service.id_taken:
            await registrations.set_instance_state(
                service.db,
                instance_id=service.instance_id,
                state=InstanceState.STOPPED,
                now=service.clock.now(),
            )
    except DB_ERRORS as exc:
        log.warning("could not mark instance stopped: %s", describe(exc))
    await service.events.stop()  # hooks and alerts: what is queued, for up to 2 s
    if service.http is not None:
        await service.http.stop()  # last: /readyz said 503 through the whole drain
    await service.db.close()
    log.info("phase 4: instance %s stopped", service.instance_id)
