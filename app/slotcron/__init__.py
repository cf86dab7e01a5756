"""slotcron: an asyncio cron scheduler for clusters. Every slot of every job runs exactly once.

from slotcron import cron, every, JobContext

@cron("0 */10 * * *")
async def rank_members() -> None: ...
"""

from typing import TYPE_CHECKING, Any

from slotcron.errors import DatabaseUnreachable, InvalidJobError, SlotcronError
from slotcron.jobs.context import JobContext
from slotcron.jobs.registry import cron, every, task
from slotcron.observe.hooks import Hook, RunEvent, SlotsEvent
from slotcron.version import __version__

if TYPE_CHECKING:
    from slotcron.client import Client
    from slotcron.service.scheduler import Scheduler

__all__ = [
    "Client",
    "DatabaseUnreachable",
    "Hook",
    "InvalidJobError",
    "JobContext",
    "RunEvent",
    "Scheduler",
    "SlotcronError",
    "SlotsEvent",
    "__version__",
    "cron",
    "every",
    "task",
]


def __getattr__(name: str) -> Any:
    # The client needs the database layer: imported on first use, so that a job module's
    # `from slotcron import cron` (and every CLI command) does not pay for it.
    if name == "Client":
        from slotcron.client import Client

        return Client
    if name == "Scheduler":  # the whole engine behind it, loaded when an application asks
        from slotcron.service.scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'slotcron' has no attribute {name!r}")
