"""slotcron: an asyncio cron scheduler for clusters. Every slot of every job runs exactly once.

from app import cron, every, JobContext

@cron("0 */10 * * *")
async def rank_members() -> None: ...
"""

from app.context import JobContext
from app.errors import InvalidJobError
from app.registry import cron, every
from app.version import __version__

__all__ = ["InvalidJobError", "JobContext", "__version__", "cron", "every"]
