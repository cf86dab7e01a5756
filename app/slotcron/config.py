"""One typed configuration object, read once from the environment (``SCHEDULER_*``) and ``.env``.

Everything else receives a :class:`Settings`; nothing reads the environment on its own.
A wrong value fails at start-up with :class:`~slotcron.errors.ConfigError` naming the variable,
and a database password never appears in any message.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import URL, make_url

from slotcron.database_url import mask_url_text as mask_url_text
from slotcron.database_url import normalise, render_url
from slotcron.database_url import sqlite_file as sqlite_file
from slotcron.errors import ConfigError
from slotcron.schedule.slots import zone_problem

PREFIX = "SCHEDULER_"

MAX_SECONDS = 86_400.0
"""Upper bound of every duration setting (leases, heartbeats, shutdown phases): one day."""
MIN_HEARTBEAT = 0.05
"""Below this a heartbeat is a busy loop (``1e-9`` spun a core at 98 %)."""
MAX_RETENTION_DAYS = 36_500
MAX_CONCURRENCY = 100_000
MAX_POOL_SIZE = 1_000
_HOST_NAME = re.compile(r"^[A-Za-z0-9.\-:\[\]]{1,253}$")
_HOOK_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""``module:attribute``, each a dotted Python name (what ``SCHEDULER_HOOKS`` lists)."""
MIN_TOKEN_LENGTH = 16
"""Characters of an admin or read token at the least: shorter ones are guessed too soon."""
_SECRET_FIELDS = ("database_url", "admin_token", "read_token", "alert_webhook_url")
"""Fields whose value no configuration error quotes."""
ALERT_EVENTS = ("FAILED", "ABANDONED", "MISSED", "FENCED")
"""What ``SCHEDULER_ALERT_EVENTS`` may name (and its default: all of them)."""


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _split_tokens(value: SecretStr | None) -> list[str]:
    """The tokens of a comma-separated token setting (as validated: no blank one)."""
    return value.get_secret_value().split(",") if value is not None else []


class Settings(BaseSettings):
    """Every ``SCHEDULER_*`` variable of the contract, typed and validated."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
        env_ignore_empty=True,  # VAR= in .env means unset, not an empty value
    )

    database_url: SecretStr = SecretStr("sqlite+aiosqlite:///./slotcron.db")
    database_pooler: Literal["none", "session", "transaction"] = "none"
    """What sits between slotcron and PostgreSQL: PgBouncer's pool mode, or nothing."""
    jobs: Annotated[list[str], NoDecode] = Field(default_factory=list)
    hooks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``module:attribute`` of each :class:`~slotcron.Hook` (or factory of one) to attach."""
    instance_id: str = Field(default_factory=_default_instance_id, min_length=1, max_length=200)
    timezone: str = "UTC"
    # Every number is finite and bounded: ``inf``, ``nan`` and absurd values that would pass a
    # bare ``> 0`` make the service fire nothing, crash or spin (issue 13).
    max_concurrency: int = Field(default=1000, gt=0, le=MAX_CONCURRENCY)
    pool_size: int = Field(default=10, gt=0, le=MAX_POOL_SIZE)
    lease_seconds: float = Field(
        default=60.0, ge=MIN_HEARTBEAT * 2, le=MAX_SECONDS, allow_inf_nan=False
    )
    heartbeat_seconds: float = Field(
        default=15.0, ge=MIN_HEARTBEAT, le=MAX_SECONDS, allow_inf_nan=False
    )
    shutdown_drain_timeout: float = Field(default=30.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    shutdown_cancel_timeout: float = Field(default=10.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    http_host: str = "127.0.0.1"
    http_port: int | None = Field(default=None, ge=0, le=65535)
    http_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    admin_token: SecretStr | None = None
    """Tokens that may read and write the admin API, comma-separated (several: rotation)."""
    read_token: SecretStr | None = None
    """Tokens that may only read the admin API, comma-separated. Listed after
    ``admin_token``, so its validator sees the admin tokens."""
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    auto_migrate: bool | None = None
    history_retention_days: float = Field(
        default=30, gt=0, le=MAX_RETENTION_DAYS, allow_inf_nan=False
    )

    # Alerts (app/slotcron/observe/alerts.py): one JSON POST per outcome worth attention. The URL
    # may carry a
    # password (basic auth of the webhook), so it is a secret: never printed unmasked.
    alert_webhook_url: SecretStr | None = None
    alert_events: Annotated[frozenset[str], NoDecode] = frozenset(ALERT_EVENTS)

    @field_validator("alert_webhook_url", mode="after")
    @classmethod
    def _webhook_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value().strip()
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"must be an http:// or https:// URL with a host, got {mask_url_text(raw)!r}"
            )
        try:
            parts.port  # noqa: B018 (parsing the port is the check)
        except ValueError:
            raise ValueError(f"bad port in {mask_url_text(raw)!r}") from None
        return SecretStr(raw)

    @field_validator("alert_events", mode="before")
    @classmethod
    def _alert_events(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip().upper() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple | set | frozenset):
            unknown = sorted(str(v) for v in value if v not in ALERT_EVENTS)
            if unknown:
                raise ValueError(
                    f"unknown event {unknown[0]!r}; use a comma-separated subset of "
                    + ",".join(ALERT_EVENTS)
                )
            if not value:
                raise ValueError("names no event; use e.g. " + ",".join(ALERT_EVENTS))
            return frozenset(value)
        return value

    @field_validator("jobs", "hooks", "http_allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("hooks")
    @classmethod
    def _hook_specs(cls, value: list[str]) -> list[str]:
        for spec in value:
            if not _HOOK_SPEC.match(spec):
                raise ValueError(f"{spec!r} is not module:attribute (e.g. myapp.hooks:checkins)")
        return value

    @field_validator("http_allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for host in value:
            if not _HOST_NAME.match(host):
                raise ValueError(f"{host!r} is not a host name (expected e.g. cron.example.com)")
        return [host.lower() for host in value]

    @field_validator("admin_token", "read_token")
    @classmethod
    def _usable_tokens(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        # No message names a token's value, or even part of it: they say which one, by place.
        if value is None:
            return None
        raw = value.get_secret_value()
        if not raw.strip():
            raise ValueError(
                "is blank; unset it, or set a token "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        parts = [part.strip() for part in raw.split(",")]
        for place, token in enumerate(parts, start=1):
            # "SCHEDULER_ADMIN_TOKEN: is shorter ..." for one token; "token 2 of 3 is ..." else.
            which = f"token {place} of {len(parts)} " if len(parts) > 1 else ""
            if not token:
                raise ValueError(
                    f"{which}is empty: tokens are separated by single commas, none blank"
                )
            if not all(33 <= ord(c) <= 126 for c in token):
                raise ValueError(
                    f"{which}must be printable ASCII without spaces: it travels in an HTTP "
                    "header, which browsers refuse to send with other characters"
                )
            if len(token) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"{which}is shorter than {MIN_TOKEN_LENGTH} characters; make one with "
                    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
                )
        if len(set(parts)) < len(parts):
            raise ValueError("lists the same token twice")
        admin = info.data.get("admin_token") if info.field_name == "read_token" else None
        if admin is not None and set(parts) & set(_split_tokens(admin)):
            raise ValueError(
                "holds a token SCHEDULER_ADMIN_TOKEN holds too: a token is either read-only "
                "or an admin's"
            )
        return SecretStr(",".join(parts))

    @field_validator("database_pooler", mode="before")
    @classmethod
    def _lower_pooler(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_pooler")
    @classmethod
    def _pooler_of_postgresql(cls, value: str, info: ValidationInfo) -> str:
        url = info.data.get("database_url")
        if value != "none" and url is not None:
            backend = make_url(url.get_secret_value()).get_backend_name()
            if backend != "postgresql":
                raise ValueError(
                    f"{value!r} is a PgBouncer pool mode, for PostgreSQL only; this database is "
                    f"{backend}: leave it unset (none)"
                )
        return value

    @field_validator("log_format", "log_level", mode="before")
    @classmethod
    def _normalise_case(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in ("text", "json"):
            return value.lower()
        if isinstance(value, str) and value.upper() in logging.getLevelNamesMapping():
            return value.upper()
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        problem = zone_problem(value)  # a directory ("America"), a path, an empty name: none
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("database_url", mode="after")
    @classmethod
    def _parse_url(cls, value: SecretStr) -> SecretStr:
        return SecretStr(normalise(value.get_secret_value()))

    @field_validator("heartbeat_seconds")
    @classmethod
    def _heartbeat_inside_lease(cls, value: float, info: ValidationInfo) -> float:
        lease = info.data.get("lease_seconds")
        if lease is not None and value >= lease:
            raise ValueError(
                f"must be shorter than SCHEDULER_LEASE_SECONDS ({lease:g}), "
                "or leases lapse between heartbeats"
            )
        return value

    @property
    def admin_tokens(self) -> tuple[SecretStr, ...]:
        """Each token of ``SCHEDULER_ADMIN_TOKEN`` (none when unset)."""
        return tuple(SecretStr(t) for t in _split_tokens(self.admin_token))

    @property
    def read_tokens(self) -> tuple[SecretStr, ...]:
        """Each token of ``SCHEDULER_READ_TOKEN`` (none when unset)."""
        return tuple(SecretStr(t) for t in _split_tokens(self.read_token))

    @property
    def admin_api_protection(self) -> str:
        """One line for the log of ``run`` and ``check``: who may use the admin API."""
        if self.admin_token is None and self.read_token is None:
            return (
                "admin API: no SCHEDULER_ADMIN_TOKEN, so every write is refused and reads are "
                "open to anyone who can reach the HTTP port"
            )
        admins, readers = len(self.admin_tokens), len(self.read_tokens)
        writes = (
            f"writes need one of {admins} admin token(s) (SCHEDULER_ADMIN_TOKEN)"
            if admins
            else "every write is refused (no SCHEDULER_ADMIN_TOKEN)"
        )
        reads = (
            f"reads need one of {readers} read token(s) (SCHEDULER_READ_TOKEN) or an admin token"
            if readers
            else "reads need the bearer token SCHEDULER_ADMIN_TOKEN"
        )
        return f"admin API: {reads}; {writes}"

    @property
    def url(self) -> URL:
        """The database URL (with its password; never print it: use :attr:`safe_url`)."""
        return make_url(self.database_url.get_secret_value())

    @property
    def safe_url(self) -> str:
        return render_url(self.url)

    @property
    def backend(self) -> str:
        """``sqlite``, ``postgresql`` or ``mysql``."""
        return self.url.get_backend_name()

    @property
    def migrate_on_start(self) -> bool:
        if self.auto_migrate is not None:
            return self.auto_migrate
        return self.backend == "sqlite"


def _undecodable(environ: dict[str, str]) -> str | None:
    for key, value in environ.items():
        if key.upper().startswith(PREFIX):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return key
    return None


def _unknown_variables(environ: dict[str, str]) -> list[str]:
    # pydantic-settings matches names case-insensitively, so the typo check must too.
    known = {PREFIX + name.upper() for name in Settings.model_fields}
    return sorted(
        key for key in environ if key.upper().startswith(PREFIX) and key.upper() not in known
    )


def load_settings(**overrides: Any) -> Settings:
    """Read the environment (and ``.env``) once; raise :class:`ConfigError` on the first bad value.

    A variable starting with ``SCHEDULER_`` that slotcron does not know is an error too: a typo
    in a variable name must not silently leave the default in force. So is an override (a
    setting given by name, lower case, as :class:`~slotcron.Scheduler` takes them) that names no
    setting; a bad override's error names it as it was given.
    """
    unknown = sorted(set(overrides) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(unknown[0], "unknown setting (is it misspelt?)")
    _check_environment(_environment())
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise _config_error(exc, overrides) from None


def _environment() -> dict[str, str]:
    """The process's environment, with the ``SCHEDULER_*`` lines of ``.env`` it does not set."""
    environ = dict(os.environ)
    if Path(".env").is_file():
        from dotenv import dotenv_values

        try:
            values = dotenv_values(".env", encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(".env", "is not valid UTF-8") from None
        for key, value in values.items():
            if key.upper().startswith(PREFIX):
                environ.setdefault(key, value or "")
    return environ


def _check_environment(environ: dict[str, str]) -> None:
    """What pydantic would not refuse: misspelt names, undecodable values, blank tokens."""
    unknown = _unknown_variables(environ)
    if unknown:
        raise ConfigError(unknown[0], "unknown variable (is it misspelt?)")
    undecodable = _undecodable(environ)
    if undecodable:
        raise ConfigError(undecodable, "is not valid UTF-8")
    # env_ignore_empty reads `VAR=` as unset; a blank token must not silently open the API.
    tokens = (PREFIX + "ADMIN_TOKEN", PREFIX + "READ_TOKEN")
    blank = sorted(k.upper() for k, v in environ.items() if k.upper() in tokens and not v.strip())
    if blank:
        raise ConfigError(blank[0], "is blank; unset it, or set a token")


def _config_error(exc: ValidationError, overrides: dict[str, Any]) -> ConfigError:
    """The first error, naming the variable (or the override) and quoting the value given,
    unless it is a secret's."""
    error = exc.errors()[0]
    loc = str(error["loc"][0]) if error["loc"] else ""
    variable = (loc if loc in overrides else PREFIX + loc.upper()) if loc else "configuration"
    message = str(error["msg"]).removeprefix("Value error, ")
    quotable = loc and loc not in _SECRET_FIELDS and "input" in error
    if quotable and not isinstance(error["input"], dict):
        message += f" (got {error['input']!r})"
    return ConfigError(variable, mask_url_text(message))
