"""The public extension point: :class:`Hook`, the events it hears (:class:`RunEvent`,
:class:`SlotsEvent`), and :func:`load_hooks` for ``SCHEDULER_HOOKS``.

A hook's events are announced by :class:`slotcron.observe.events.Events` (each once, by the
instance whose write recorded it, after the write) and delivered through a bounded queue and a
task of the hook's own (:mod:`slotcron.observe.delivery`): a hook that is slow or raises never
delays, fails or loses a run.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from slotcron.errors import ConfigError

if TYPE_CHECKING:
    from slotcron.jobs.context import JobContext


class RunEvent(NamedTuple):
    """One run, as a hook sees it: at its body's start (``status`` ``RUNNING``) or its end.

    ``fenced``: the run was stopped, or its outcome refused, because it was no longer this
    instance's (its lease lapsed, its claim was taken over): nothing of its end was recorded by
    this instance (``status`` says how its body ended: ``STOPPED`` when fencing stopped it).
    ``lag_seconds``: from the slot to the body's start, by the database's clock;
    ``duration_seconds``: the body's run time. For an ``ABANDONED`` run (found by the leader or
    at start-up), ``instance_id`` is the instance that let its lease lapse, ``started_at`` its
    body's recorded start, ``error`` why it was abandoned, and its lag and duration are
    unknown (None).

    Immutable, one shared by every listener (a named tuple: built for every run, it must be
    cheap).
    """

    job: str
    scheduled_at: datetime
    execution_id: int
    attempt: int | None
    trigger: str | None
    instance_id: str | None
    status: str
    fenced: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    params: Mapping[str, Any] = MappingProxyType({})
    lag_seconds: float | None = None
    duration_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SlotsEvent:
    """Slots recorded not run: ``SKIPPED`` (paused, overlapping, excluded) or ``MISSED`` (the
    misfire policy). One slot has ``first == last`` and ``count == 1``; a passed-over range is
    one record from ``first`` to ``last`` (``count`` None past 10,000 slots of a cron)."""

    job: str
    status: str
    reason: str | None
    first: datetime
    last: datetime
    count: int | None = 1


class Hook:
    """The base of a user hook: override what you need; every method is optional.

    The ``async`` methods are called from the hook's own task, one event at a time, in order;
    one that raises is logged and gets the next event. ``wrap_run`` is the exception: it runs in
    the run's task, and returns an async context manager entered around the job's body (a
    tracing span, a Sentry scope); the body's outcome is recorded whatever the wrapper does.
    """

    async def run_started(self, run: RunEvent) -> None:
        """A run's body starts (its start is recorded)."""

    async def run_finished(self, run: RunEvent) -> None:
        """A run ended: ``COMPLETED``, ``FAILED``, ``STOPPED``, ``ABANDONED``; ``run.fenced``."""

    async def slots_passed(self, event: SlotsEvent) -> None:
        """Slots were recorded ``SKIPPED`` or ``MISSED``."""

    def wrap_run(self, ctx: JobContext) -> AbstractAsyncContextManager[Any]:
        """An async context manager around the body, entered in its task."""
        raise NotImplementedError


def overrides(hook: object, name: str, base: type = Hook) -> bool:
    """Whether ``hook`` does something in ``name`` (an optional method left as the base's
    is never called, its events never queued)."""
    method = getattr(type(hook), name, None)
    return method is not None and method is not getattr(base, name, None)


def hook_name(hook: Hook, among: Sequence[Hook] = ()) -> str:
    """The hook's name in logs and in the ``hook`` label: its class, numbered when several
    hooks are of one class."""
    kind = type(hook)
    name = f"{kind.__module__}.{kind.__qualname__}"
    same = [h for h in among if type(h) is kind]
    if len(same) > 1:
        name += f"#{same.index(hook) + 1}"
    return name


def load_hooks(specs: Sequence[str]) -> list[Hook]:
    """The hooks ``SCHEDULER_HOOKS`` names: each ``module:attribute``, a :class:`Hook` instance
    or a :class:`Hook` subclass (made with no argument). Raises :class:`ConfigError` naming the
    variable and what is wrong."""
    return [_load_hook(spec.strip()) for spec in specs if spec.strip()]


def _load_hook(spec: str) -> Hook:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError("SCHEDULER_HOOKS", f"{spec!r} is not module:attribute")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            "SCHEDULER_HOOKS", f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError("SCHEDULER_HOOKS", f"{module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if isinstance(found, type) and issubclass(found, Hook):
        try:
            found = found()
        except Exception as exc:
            raise ConfigError(
                "SCHEDULER_HOOKS", f"{spec}() failed: {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(found, Hook):
        raise ConfigError(
            "SCHEDULER_HOOKS", f"{spec} is a {type(found).__name__}, not a slotcron.Hook"
        )
    return found
