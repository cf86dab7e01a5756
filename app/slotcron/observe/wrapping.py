"""Around a job's body: the user hooks' ``wrap_run`` context managers, in the body's own task.

A wrapper sees the body run inside it (a span current, a Sentry scope, a check-in timed) and
the body's exception on the way out; it cannot lose, fail or change the run. A wrapper that
raises on entry is logged and left out (the body runs); one that raises on exit is logged; one
that would swallow the body's exception does not (the run is recorded as its body ended).
A wrapper is inline by nature: one that is slow delays its run's body, and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotcron.jobs.context import JobContext

log = logging.getLogger("slotcron.hooks")

Wrapper = Callable[["JobContext"], AbstractAsyncContextManager[Any]]


async def around(
    wrappers: Sequence[Wrapper], ctx: JobContext, body: Callable[[], Awaitable[None]]
) -> None:
    """Await ``body()`` inside each of ``wrappers(ctx)`` entered (first outermost)."""
    entered: list[AbstractAsyncContextManager[Any]] = []
    for wrap in wrappers:
        try:
            manager = wrap(ctx)
            await manager.__aenter__()
        except Exception:
            log.exception("%s failed on entry: %s runs without it", _name(wrap), ctx.job)
            continue
        entered.append(manager)
    try:
        await body()
    except BaseException as exc:
        await _leave(entered, ctx, exc)
        raise
    await _leave(entered, ctx, None)


async def _leave(
    entered: list[AbstractAsyncContextManager[Any]], ctx: JobContext, exc: BaseException | None
) -> None:
    for manager in reversed(entered):
        try:
            await manager.__aexit__(
                type(exc) if exc else None, exc, exc.__traceback__ if exc else None
            )
        except Exception:
            log.exception("%s failed on exit (run of %s)", type(manager).__qualname__, ctx.job)


def _name(wrap: Wrapper) -> str:
    owner = getattr(wrap, "__self__", None)
    return f"{type(owner).__qualname__}.wrap_run" if owner is not None else repr(wrap)
