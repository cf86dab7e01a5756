"""Health and readiness probes, Prometheus metrics, the JSON admin API and the dashboard,
served when ``SCHEDULER_HTTP_PORT`` is set."""

from slotcron.http.server import HttpServer

__all__ = ["HttpServer"]
