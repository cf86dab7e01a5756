"""Configuration: ``load_settings()`` reads ``SCHEDULER_*`` and ``.env``, or stops with one line.

Each test runs in an empty temporary directory (no stray ``.env``) with every ``SCHEDULER_*``
variable of the surrounding environment removed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from slotcron.config import load_settings
from slotcron.errors import ConfigError

PASSWORD = "hunter2"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in list(os.environ):
        if key.upper().startswith("SCHEDULER_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refusal(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> ConfigError:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    return caught.value


# --- Defaults -------------------------------------------------------------------------------


def test_defaults_match_the_contract_table() -> None:
    settings = load_settings()
    assert settings.database_url.get_secret_value() == "sqlite+aiosqlite:///./slotcron.db"
    assert settings.timezone == "UTC"
    assert settings.lease_seconds == 60
    assert settings.heartbeat_seconds == 15
    assert settings.shutdown_drain_timeout == 30
    assert settings.shutdown_cancel_timeout == 10
    assert settings.http_host == "127.0.0.1"
    assert settings.http_port is None, "unset = no HTTP server"
    assert settings.admin_token is None, "unset = admin API refuses every write"
    assert settings.log_format == "text"
    assert settings.log_level == "INFO"
    assert settings.history_retention_days == 30
    assert settings.jobs == []


def test_the_default_instance_id_is_host_pid_random_and_differs_per_load() -> None:
    first, second = load_settings().instance_id, load_settings().instance_id
    assert str(os.getpid()) in first.split("-")
    assert first != second


def test_auto_migrate_defaults_to_true_for_sqlite() -> None:
    settings = load_settings()
    assert settings.backend == "sqlite"
    assert settings.migrate_on_start is True


@pytest.mark.parametrize(
    "url",
    ["postgresql+asyncpg://u:p@db.example/slotcron", "mysql+aiomysql://u:p@db.example/slotcron"],
)
def test_auto_migrate_defaults_to_false_for_other_databases(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", url)
    assert load_settings().migrate_on_start is False


def test_an_explicit_auto_migrate_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "postgresql+asyncpg://u:p@db.example/slotcron")
    monkeypatch.setenv("SCHEDULER_AUTO_MIGRATE", "true")
    assert load_settings().migrate_on_start is True


# --- Values read from the environment -------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ("postgresql://u:p@db.example/app", "postgresql+asyncpg://u:p@db.example/app"),
        ("postgres://u:p@db.example/app", "postgresql+asyncpg://u:p@db.example/app"),
        ("mysql://u:p@db.example/app", "mysql+aiomysql://u:p@db.example/app"),
        ("mariadb://u:p@db.example/app", "mysql+aiomysql://u:p@db.example/app"),
        ("sqlite:///./other.db", "sqlite+aiosqlite:///./other.db"),
    ],
)
def test_a_plain_database_url_is_normalised_to_its_async_driver(
    monkeypatch: pytest.MonkeyPatch, written: str, normalised: str
) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", written)
    settings = load_settings()
    assert settings.url.render_as_string(hide_password=False) == normalised


def test_the_password_survives_normalisation_for_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"postgresql://u:{PASSWORD}@db.example:5432/app")
    url = load_settings().url
    assert (url.username, url.password, url.host, url.port) == ("u", PASSWORD, "db.example", 5432)


def test_jobs_is_a_comma_separated_list_of_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_JOBS", "a, b")
    assert load_settings().jobs == ["a", "b"]


def test_empty_entries_in_jobs_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_JOBS", " slotcron.examples ,, other.jobs , ")
    assert load_settings().jobs == ["slotcron.examples", "other.jobs"]


def test_numbers_and_choices_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_LEASE_SECONDS", "120")
    monkeypatch.setenv("SCHEDULER_HEARTBEAT_SECONDS", "20")
    monkeypatch.setenv("SCHEDULER_HTTP_PORT", "8080")
    monkeypatch.setenv("SCHEDULER_TIMEZONE", "Asia/Seoul")
    monkeypatch.setenv("SCHEDULER_LOG_FORMAT", "json")
    monkeypatch.setenv("SCHEDULER_LOG_LEVEL", "debug")
    settings = load_settings()
    assert settings.lease_seconds == 120
    assert settings.heartbeat_seconds == 20
    assert settings.http_port == 8080
    assert settings.timezone == "Asia/Seoul"
    assert settings.log_format == "json"
    assert settings.log_level == "DEBUG"


# --- The .env file --------------------------------------------------------------------------


def test_a_dotenv_file_in_the_working_directory_is_read(clean_environment: Path) -> None:
    (clean_environment / ".env").write_text(
        "# local settings\nSCHEDULER_LEASE_SECONDS=90\nSCHEDULER_JOBS=a,b\n", encoding="utf-8"
    )
    settings = load_settings()
    assert settings.lease_seconds == 90
    assert settings.jobs == ["a", "b"]


def test_a_misspelt_variable_in_the_dotenv_file_is_refused(clean_environment: Path) -> None:
    (clean_environment / ".env").write_text("SCHEDULER_LEASE_SECOND=90\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith("SCHEDULER_LEASE_SECOND")


def test_a_bad_value_in_the_dotenv_file_is_refused_naming_the_variable(
    clean_environment: Path,
) -> None:
    (clean_environment / ".env").write_text("SCHEDULER_LOG_FORMAT=xml\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith("SCHEDULER_LOG_FORMAT")


# --- Bad values stop start-up with one line naming the variable ----------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        pytest.param("SCHEDULER_DATABASE_URL", "not a url", id="unparseable-url"),
        pytest.param("SCHEDULER_DATABASE_URL", "oracle://u:p@h/db", id="unsupported-scheme"),
        pytest.param("SCHEDULER_DATABASE_URL", "postgresql+asyncpg:///db", id="url-without-host"),
        pytest.param("SCHEDULER_LEASE_SECONDS", "-1", id="negative-lease"),
        pytest.param("SCHEDULER_LEASE_SECONDS", "soon", id="lease-not-a-number"),
        pytest.param("SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT", "-1", id="negative-drain-timeout"),
        pytest.param("SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT", "-1", id="negative-cancel-timeout"),
        pytest.param("SCHEDULER_TIMEZONE", "Mars/Base", id="unknown-timezone"),
        pytest.param("SCHEDULER_LOG_FORMAT", "xml", id="unknown-log-format"),
        pytest.param("SCHEDULER_LOG_LEVEL", "LOUD", id="unknown-log-level"),
        pytest.param("SCHEDULER_HTTP_PORT", "70000", id="port-out-of-range"),
        pytest.param("SCHEDULER_HEARTBEAT_SECONDS", "60", id="heartbeat-equal-to-lease"),
        pytest.param("SCHEDULER_HEARTBEAT_SECONDS", "61", id="heartbeat-longer-than-lease"),
        pytest.param("SCHEDULER_LEASE_SECOND", "30", id="misspelt-variable"),
    ],
)
def test_a_bad_value_is_refused_with_one_line_starting_with_the_variable_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    error = refusal(monkeypatch, variable, value)
    message = str(error)
    assert message.startswith(variable + ":"), message
    assert "\n" not in message
    assert error.variable == variable


def test_a_heartbeat_is_checked_against_the_lease_actually_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_LEASE_SECONDS", "10")
    error = refusal(monkeypatch, "SCHEDULER_HEARTBEAT_SECONDS", "10")
    assert str(error).startswith("SCHEDULER_HEARTBEAT_SECONDS")
    monkeypatch.setenv("SCHEDULER_HEARTBEAT_SECONDS", "9")
    assert load_settings().heartbeat_seconds == 9


def test_config_error_is_a_slotcron_error_not_a_validation_error() -> None:
    from slotcron.errors import SlotcronError

    assert issubclass(ConfigError, SlotcronError)


# --- A database password never appears in any output --------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"oracle://u:{PASSWORD}@h/db", id="unsupported-scheme"),
        pytest.param(f"postgresql://u:{PASSWORD}@h:port/db", id="unparseable-port"),
        pytest.param(f"u:{PASSWORD}@h/db", id="unparseable-no-scheme"),
        pytest.param(f"oracle://u:{PASSWORD}@h:port/db", id="unparseable-and-unsupported"),
        pytest.param(f"postgresql://u:{PASSWORD}@/db", id="no-host"),
        pytest.param(PASSWORD, id="password-pasted-alone"),
    ],
)
def test_a_refused_database_url_never_shows_its_password(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_DATABASE_URL", url)
    assert str(error).startswith("SCHEDULER_DATABASE_URL")
    assert PASSWORD not in str(error)
    assert PASSWORD not in repr(error)
    assert PASSWORD not in error.problem


def test_an_accepted_database_url_never_shows_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"postgresql://u:{PASSWORD}@h/db")
    settings = load_settings()
    assert settings.safe_url == "postgresql+asyncpg://u:***@h/db"
    assert PASSWORD not in settings.safe_url
    assert PASSWORD not in repr(settings)
    assert PASSWORD not in str(settings)
    assert PASSWORD not in str(settings.database_url)


def test_a_password_given_as_a_query_argument_never_shows_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"postgresql://u@h/db?password={PASSWORD}")
    settings = load_settings()
    assert PASSWORD not in settings.safe_url


# --- Every setting finite and sane (issue 13) ------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCHEDULER_LEASE_SECONDS", "inf"),
        ("SCHEDULER_LEASE_SECONDS", "nan"),
        ("SCHEDULER_LEASE_SECONDS", "1e308"),
        ("SCHEDULER_HEARTBEAT_SECONDS", "1e-9"),
        ("SCHEDULER_HEARTBEAT_SECONDS", "-inf"),
        ("SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT", "inf"),
        ("SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT", "1e12"),
        ("SCHEDULER_HISTORY_RETENTION_DAYS", "inf"),
        ("SCHEDULER_HISTORY_RETENTION_DAYS", "1e9"),
        ("SCHEDULER_MAX_CONCURRENCY", "10000000000"),
        ("SCHEDULER_POOL_SIZE", "100000"),
        ("SCHEDULER_HTTP_ALLOWED_HOSTS", "ok.example,bad/host"),
    ],
)
def test_infinite_or_absurd_values_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    error = refusal(monkeypatch, variable, value)
    assert error.variable == variable
    assert str(error).startswith(variable)


def test_the_largest_sane_values_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_LEASE_SECONDS", "86400")
    monkeypatch.setenv("SCHEDULER_HEARTBEAT_SECONDS", "0.05")
    monkeypatch.setenv("SCHEDULER_HISTORY_RETENTION_DAYS", "36500")
    settings = load_settings()
    assert (settings.lease_seconds, settings.heartbeat_seconds) == (86400, 0.05)


@pytest.mark.parametrize("value", [" ", "\t  "])
def test_a_blank_admin_token_is_a_configuration_error_not_an_open_api(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_ADMIN_TOKEN", value)
    assert error.variable == "SCHEDULER_ADMIN_TOKEN"
    assert "blank" in str(error)


def test_an_empty_admin_token_in_the_dotenv_file_is_a_configuration_error(
    clean_environment: Path,
) -> None:
    (clean_environment / ".env").write_text("SCHEDULER_ADMIN_TOKEN=\n")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.variable == "SCHEDULER_ADMIN_TOKEN"


def test_a_token_in_the_dotenv_file_is_read(clean_environment: Path) -> None:
    (clean_environment / ".env").write_text(f"SCHEDULER_ADMIN_TOKEN={TOKEN}\n")
    token = load_settings().admin_token
    assert token is not None and token.get_secret_value() == TOKEN


def test_a_non_ascii_admin_token_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_ADMIN_TOKEN", "pässwörd-token")
    assert error.variable == "SCHEDULER_ADMIN_TOKEN"
    assert "pässwörd" not in str(error)


def test_a_sqlite_file_in_a_directory_that_does_not_exist_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_DATABASE_URL", "sqlite+aiosqlite:///./missing/x.db")
    assert error.variable == "SCHEDULER_DATABASE_URL"
    assert "does not exist" in str(error)


def test_a_password_holding_an_unencoded_at_sign_is_masked_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"postgresql+asyncpg://app:p@{PASSWORD}-2026@db.example/x"
    error = refusal(monkeypatch, "SCHEDULER_DATABASE_URL", url)
    assert PASSWORD not in str(error)
    assert "%40" in str(error)


def test_masking_free_text_hides_everything_up_to_the_last_at_of_the_url() -> None:
    from slotcron.config import mask_url_text

    text = f"connect postgresql://app:p@{PASSWORD}@@db/x failed; mail ops@example.com"
    masked = mask_url_text(text)
    assert PASSWORD not in masked
    assert "ops@example.com" in masked


def test_allowed_hosts_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_HTTP_ALLOWED_HOSTS", "Cron.Example.com, 10.0.0.5")
    assert load_settings().http_allowed_hosts == ["cron.example.com", "10.0.0.5"]


def test_the_protection_of_the_admin_api_is_stated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "reads are open" in load_settings().admin_api_protection
    monkeypatch.setenv("SCHEDULER_ADMIN_TOKEN", TOKEN)
    protection = load_settings().admin_api_protection
    assert "need the bearer token" in protection
    assert "s3cret" not in protection
    monkeypatch.setenv("SCHEDULER_READ_TOKEN", f"{READER},{READER}-next")
    protection = load_settings().admin_api_protection
    assert "reads need one of 2 read token(s)" in protection
    assert "writes need one of 1 admin token(s)" in protection
    assert READER not in protection


# --- Tokens: several of each kind, at least 16 characters, never echoed -----------------------

TOKEN = "s3cret-token-4f9a2c"
READER = "r3ader-token-77e1d0"


def test_several_admin_tokens_separated_by_commas_are_each_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_ADMIN_TOKEN", f" {TOKEN} , {TOKEN}-new ")
    settings = load_settings()
    assert [t.get_secret_value() for t in settings.admin_tokens] == [TOKEN, f"{TOKEN}-new"]
    assert settings.read_tokens == ()
    assert TOKEN not in repr(settings)


def test_read_tokens_are_their_own_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_READ_TOKEN", f"{READER},{READER}-2")
    settings = load_settings()
    assert [t.get_secret_value() for t in settings.read_tokens] == [READER, f"{READER}-2"]
    assert settings.admin_tokens == ()


@pytest.mark.parametrize("variable", ["SCHEDULER_ADMIN_TOKEN", "SCHEDULER_READ_TOKEN"])
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("tiny!", ": is shorter than 16 characters"),
        ("short-secret-15", ": is shorter than 16 characters"),
        (f"{TOKEN},short-secret-15", "token 2 of 2 is shorter than 16 characters"),
        (f"{TOKEN},,{READER}", "token 2 of 3 is empty"),
        (f"{TOKEN},", "token 2 of 2 is empty"),
        (f"{TOKEN},{TOKEN}", "lists the same token twice"),
        (f"{TOKEN},pässwörd-secret-token", "token 2 of 2 must be printable ASCII"),
    ],
)
def test_a_token_too_short_empty_or_doubled_stops_start_up_naming_the_variable_never_the_token(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    error = refusal(monkeypatch, variable, value)
    assert error.variable == variable
    assert says in str(error)
    message = str(error)
    for token in value.split(","):
        if token.strip():
            assert token.strip() not in message, "a token's value is never echoed"
    assert "\n" not in message, "one line"


def test_a_sixteen_character_token_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_READ_TOKEN", "sixteen-chars-ok")
    assert len(load_settings().read_tokens[0].get_secret_value()) == 16


@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_a_blank_read_token_is_a_configuration_error_too(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_READ_TOKEN", value)
    assert error.variable == "SCHEDULER_READ_TOKEN"
    assert "blank" in str(error)


def test_a_token_both_read_only_and_admin_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_ADMIN_TOKEN", TOKEN)
    error = refusal(monkeypatch, "SCHEDULER_READ_TOKEN", f"{READER},{TOKEN}")
    assert error.variable == "SCHEDULER_READ_TOKEN"
    assert "SCHEDULER_ADMIN_TOKEN holds too" in str(error)
    assert TOKEN not in str(error) and READER not in str(error)
