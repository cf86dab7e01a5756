"""The narrow views of a running instance: :class:`Instance`, what the HTTP server reads, and
:class:`Identity`, what every part acting for it knows (shutdown's view builds on it too).

The HTTP modules never see the whole :class:`~slotcron.service.service.Service`: they read its
id, state and settings, its database and clock, the code jobs it holds, whether its background
roles are healthy and what replication the database reported. ``Service`` matches this
protocol as it is (nothing adapts it), and a test can hand the server any small object that
does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slotcron.clock import Clock
    from slotcron.config import Settings
    from slotcron.jobs.registry import Job
    from slotcron.store.database import Database
    from slotcron.store.failover import Replication


class Troubled(Protocol):
    """A background role, as a probe sees it: why it is unwell, or None."""

    @property
    def problem(self) -> str | None: ...


class ReplicationSeen(Protocol):
    """What the instance last learnt of the database's replication (None: not PostgreSQL, or
    not asked yet)."""

    @property
    def replication(self) -> Replication | None: ...


class Identity(Protocol):
    """Who the instance is and what it acts with: its id, settings, database and clock."""

    @property
    def instance_id(self) -> str: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def db(self) -> Database: ...

    @property
    def clock(self) -> Clock: ...


class Instance(Identity, Protocol):
    """What HTTP reads of the instance it serves."""

    @property
    def state(self) -> str:
        """``starting``, ``running``, ``draining`` or ``stopped``."""
        ...

    @property
    def jobs(self) -> Sequence[Job]:
        """The code jobs (``@cron``, ``@every``) this instance registered."""
        ...

    @property
    def roles(self) -> Sequence[Troubled]:
        """The supervised background roles, whose problems ``/readyz`` names."""
        ...

    @property
    def reconnection(self) -> ReplicationSeen: ...
