# slotcron: an asyncio cron scheduler for clusters.
#
#   docker build -t slotcron .
#   docker run --rm -it -v slotcron-data:/data slotcron run --jobs slotcron.examples
#
# Configuration comes from the environment (see .env.example), notably:
#   SCHEDULER_DATABASE_URL  the shared database of the cluster; left at its default here
#                           (sqlite+aiosqlite:///./slotcron.db, i.e. /data/slotcron.db),
#                           which suits a single container only
#   SCHEDULER_JOBS          comma-separated job modules to import
#   SCHEDULER_ADMIN_TOKEN   bearer token of the admin API (unset: the API is read-only)
#
# HTTP (probes, /metrics, the admin API, the dashboard) is on port 8080 of every interface of
# the container; SCHEDULER_HTTP_PORT= (empty) turns it off.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SCHEDULER_HTTP_HOST=0.0.0.0 \
    SCHEDULER_HTTP_PORT=8080

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY app/ app/
# tzdata: the IANA time zone database for zoneinfo, whatever the base image ships.
RUN pip install --no-cache-dir . tzdata \
    && rm -rf /src

# Non-root user; /data is its writable working directory, so the SQLite default lands there.
RUN groupadd --system --gid 10001 slotcron \
    && useradd --system --uid 10001 --gid slotcron --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin slotcron \
    && mkdir -p /data \
    && chown slotcron:slotcron /data
WORKDIR /data
USER 10001:10001

EXPOSE 8080
# Liveness: /healthz answers while the event loop does. No curl in the image: Python's urllib.
# With HTTP turned off there is nothing to ask, and the check passes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 CMD ["python", "-c", \
  "import os, sys, urllib.request; port = os.environ.get('SCHEDULER_HTTP_PORT'); sys.exit(0 if not port else urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status != 200)"]

# SIGTERM starts the phased shutdown; give the container more than
# SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT + SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT to stop.
STOPSIGNAL SIGTERM
ENTRYPOINT ["slotcron"]
CMD ["run"]
