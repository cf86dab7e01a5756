"""Figures an instance already keeps (claim statistics, database errors, leadership, draining,
runs in flight, the alert sender's counters, the clock offset), read when Prometheus scrapes:
no cost between scrapes.

The collector reads a narrow view of the instance, :class:`Scraped` (``Service`` matches it as
it is), never the service itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slotcron.version import __version__

if TYPE_CHECKING:
    from slotcron.clock import Clock
    from slotcron.store.failover import Replication


class _Counted(Protocol):
    @property
    def claims(self) -> int: ...
    @property
    def taken(self) -> int: ...
    @property
    def busy_retries(self) -> int: ...
    @property
    def gave_up(self) -> int: ...


class _Claimer(Protocol):
    @property
    def stats(self) -> _Counted: ...


class _Outage(Protocol):
    @property
    def errors(self) -> int: ...
    @property
    def ongoing(self) -> bool: ...


class _Leader(Protocol):
    @property
    def leading(self) -> bool: ...


class _AlertStats(Protocol):
    @property
    def sent(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def queued(self) -> int: ...


class _Alerts(Protocol):
    @property
    def stats(self) -> _AlertStats: ...


class _Database(Protocol):
    @property
    def read_only(self) -> bool: ...


class _Reconnection(Protocol):
    @property
    def replication(self) -> Replication | None: ...
    @property
    def fenced(self) -> int: ...


class _Runtime(Protocol):
    @property
    def quarantined(self) -> int: ...


class _Shares(Protocol):
    @property
    def members(self) -> tuple[str, ...]: ...


class _Takeover(Protocol):
    @property
    def taken(self) -> int: ...
    @property
    def shares(self) -> _Shares: ...


class Scraped(Protocol):
    """What :class:`InstanceCollector` reads of an instance at scrape time (``Service``
    matches it as it is)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def runs(self) -> Sized: ...
    @property
    def claimer(self) -> _Claimer: ...
    @property
    def outage(self) -> _Outage: ...
    @property
    def leader(self) -> _Leader: ...
    @property
    def alerts(self) -> _Alerts: ...
    @property
    def db(self) -> _Database: ...
    @property
    def reconnection(self) -> _Reconnection: ...
    @property
    def runtime(self) -> _Runtime: ...
    @property
    def takeover(self) -> _Takeover: ...
    @property
    def clock(self) -> Clock: ...


def _counter(name: str, documentation: str, value: float) -> Metric:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> Metric:
    return GaugeMetricFamily(name, documentation, value=value)


class InstanceCollector(Collector):
    """Figures read from the instance's own state at scrape time."""

    def __init__(self, instance: Scraped) -> None:
        self.instance = instance

    def collect(self) -> Iterator[Metric]:
        instance = self.instance
        info = GaugeMetricFamily(
            "slotcron_instance_info", "This instance", labels=["instance", "version"]
        )
        info.add_metric([instance.instance_id, __version__], 1)
        yield info
        yield from self._claims(instance.claimer.stats)
        yield from self._health(instance)
        yield from self._alerts(instance.alerts.stats)
        yield from self._database(instance)

    @staticmethod
    def _claims(stats: _Counted) -> Iterator[Metric]:
        yield _counter(
            "slotcron_claims",
            "Slots this instance claimed (decided: run, skipped or missed)",
            stats.claims,
        )
        yield _counter(
            "slotcron_claims_lost",
            "Claims lost to another instance (the slot was already claimed)",
            stats.taken,
        )
        yield _counter(
            "slotcron_claim_busy_retries",
            "Claims retried because another instance held the job's row at that moment",
            stats.busy_retries,
        )
        yield _counter(
            "slotcron_claims_given_up",
            "Slots not claimed before their deadline (left to the misfire policy)",
            stats.gave_up,
        )

    @staticmethod
    def _health(instance: Scraped) -> Iterator[Metric]:
        yield _counter(
            "slotcron_database_errors",
            "Database calls that failed (connection lost or refused, timeouts)",
            instance.outage.errors,
        )
        yield _gauge(
            "slotcron_database_outage",
            "1 while the database is unreachable from this instance",
            1 if instance.outage.ongoing else 0,
        )
        yield _gauge(
            "slotcron_runs_in_flight", "Runs executing on this instance", len(instance.runs)
        )
        yield _gauge(
            "slotcron_leader",
            "1 while this instance holds the cluster's leadership lease",
            1 if instance.leader.leading else 0,
        )
        yield _gauge(
            "slotcron_draining",
            "1 once shutdown has begun (no more claims; in-flight runs drain)",
            1 if instance.state in ("draining", "stopped") else 0,
        )

    @staticmethod
    def _alerts(sent: _AlertStats) -> Iterator[Metric]:
        yield _counter(
            "slotcron_alerts_sent",
            "Alert events the webhook accepted (SCHEDULER_ALERT_WEBHOOK_URL)",
            sent.sent,
        )
        yield _counter(
            "slotcron_alerts_failed",
            "POSTs to the alert webhook that failed (each retry counts)",
            sent.failed,
        )
        yield _counter(
            "slotcron_alerts_dropped",
            "Alert events given up: queue full, retries exhausted, refused, or shutdown",
            sent.dropped,
        )
        yield _gauge("slotcron_alerts_queued", "Alert events waiting to be sent", sent.queued)

    @staticmethod
    def _database(instance: Scraped) -> Iterator[Metric]:
        yield _gauge(
            "slotcron_database_read_only",
            "1 while the database refuses this instance's writes as read-only",
            1 if instance.db.read_only else 0,
        )
        replication = instance.reconnection.replication
        if replication is not None:
            yield _gauge(
                "slotcron_database_synchronous_replication",
                "1 when commits wait for a standby (a failover keeps every acknowledged claim), "
                "0 when a failover can lose the last claims (PostgreSQL)",
                1 if replication.synchronous else 0,
            )
        yield _gauge(
            "slotcron_schedules_quarantined",
            "Runtime schedules due within the horizon whose rows cannot be read (listed with "
            "their error by GET /api/schedules); every other schedule fires",
            instance.runtime.quarantined,
        )
        yield _gauge(
            "slotcron_cluster_members",
            "Live instances sharing the planning of this instance's jobs, itself included",
            len(instance.takeover.shares.members),
        )
        yield _counter(
            "slotcron_slots_taken_over",
            "Slots of another instance's jobs fired here because their owner did not claim "
            "them in time (dead, paused or cut off)",
            instance.takeover.taken,
        )
        yield _counter(
            "slotcron_failover_fenced_runs",
            "Runs fenced after reconnecting because the database no longer had their claim",
            instance.reconnection.fenced,
        )
        offset: timedelta | None = getattr(instance.clock, "offset", None)
        if offset is not None:
            yield _gauge(
                "slotcron_database_clock_offset_seconds",
                "Database clock minus this machine's clock, as last measured",
                offset.total_seconds(),
            )
