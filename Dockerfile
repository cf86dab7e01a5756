# slotcron: an asyncio cron scheduler for clusters.
#
#   docker build -t slotcron .
#   docker run --rm -it -v slotcron-data:/data slotcron run --jobs app.examples
#
# Configuration comes from the environment (see .env.example), notably:
#   SCHEDULER_DATABASE_URL  the shared database of the cluster; left at its default here
#                           (sqlite+aiosqlite:///./slotcron.db, i.e. /data/slotcron.db),
#                           which suits a single container only
#   SCHEDULER_JOBS          comma-separated job modules to import
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY app/ app/
COPY migrations/ migrations/
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

# SIGTERM starts the phased shutdown; give the container more than
# SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT + SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT to stop.
STOPSIGNAL SIGTERM
ENTRYPOINT ["slotcron"]
CMD ["run"]
