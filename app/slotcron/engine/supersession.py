"""One schedule in force per job across the cluster: this instance's side of it.

At registration each job gets the fingerprint of the schedule in force as this instance
computes it (:mod:`slotcron.schedule.fingerprint`,
:func:`slotcron.store.registrations.register_jobs`); every claim
presents it, and the claim is refused under the job's row lock when the row holds another one:
a newer registration (another version, other time-zone data) changed the schedule. No extra
read is spent on learning it: the claim already reads the row.

A refused job is *superseded* here: logged once at WARNING, written to the job row's
``superseded`` (``slotcron jobs --json`` shows it while this instance lives), and never fired
again by this instance until it stops or registers the job again.

A runtime schedule's claims present its version instead
(:func:`slotcron.store.schedules.version_mark`):
one refused was updated since this instance read it. It is not superseded: it is read again
(:attr:`Supersession.changed`), and fired from then on in the version in force.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from slotcron.lifeline.outage import DB_ERRORS, describe
from slotcron.store.database import Database
from slotcron.store.registrations import mark_superseded

log = logging.getLogger("slotcron.scheduler")


class Supersession:
    def __init__(self, db: Database, instance_id: str, schedules: Mapping[str, str]) -> None:
        self.db = db
        self.instance_id = instance_id
        self.schedules = schedules
        """Each job's schedule as this instance registered it, ``"schedule (timezone)"``."""
        self.fingerprints: dict[str, str] = {}
        """The fingerprint each claim of a job presents (set at registration)."""
        self.superseded: set[str] = set()
        self.changed: Callable[[list[str]], None] = lambda names: None
        """Set by the service: read again these runtime schedules, refused for presenting a
        version another write has replaced."""

    def registered(self, fingerprints: Mapping[str, str]) -> None:
        """This instance (re)registered its jobs: their supersession ends."""
        self.fingerprints.update(fingerprints)
        self.superseded -= set(fingerprints)

    async def refused(self, names: Collection[str]) -> None:
        """Claims of ``names`` were refused: a newer registration's schedule is in force (a
        code job's), or a newer version of a runtime schedule (read again)."""
        code = {n for n in names if n in self.fingerprints}
        updated = sorted(set(names) - code)
        if updated:
            log.debug("schedules updated since this instance read them: %s", ", ".join(updated))
            self.changed(updated)
        new = sorted(code - self.superseded)
        if not new:
            return
        self.superseded.update(new)
        for name in new:
            log.warning(
                "%s: a newer registration changed its schedule on the cluster; this instance "
                "(schedule %s) stops firing it until it stops or registers it again",
                name,
                self.schedules.get(name, "?"),
            )
        try:
            await self._record(new)
        except DB_ERRORS as exc:  # only what `jobs` shows: firing has already stopped
            log.warning("could not record superseded jobs %s: %s", ", ".join(new), describe(exc))

    async def _record(self, names: list[str]) -> None:
        await mark_superseded(
            self.db, names, instance_id=self.instance_id, schedules=self.schedules
        )
