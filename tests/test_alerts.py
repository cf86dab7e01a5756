"""Alert settings and the per-job option: bad values stop start-up naming the variable, a
webhook URL's password is never printed, and no secret shape reaches an event."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slotcron.clock import SystemClock
from slotcron.config import ALERT_EVENTS, Settings, load_settings
from slotcron.errors import ConfigError, InvalidJobError
from slotcron.jobs.registry import Registry, cron, every
from slotcron.observe.alerts import Webhook, safe_url
from slotcron.observe.events import RunEvent

from tests.conftest import wait_for
from tests.test_masking import SECRET, SHAPES
from tests.webhook import webhook

PASSWORD = "pa55-w0rd"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.upper().startswith("SCHEDULER_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def refusal(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> ConfigError:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    return caught.value


def test_alerts_are_off_by_default_and_every_event_is_chosen() -> None:
    settings = load_settings()
    assert settings.alert_webhook_url is None
    assert settings.alert_events == frozenset(ALERT_EVENTS)
    assert set(ALERT_EVENTS) == {"FAILED", "ABANDONED", "MISSED", "FENCED"}


def test_alert_events_are_a_comma_separated_subset_in_any_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULER_ALERT_EVENTS", " failed, Missed ,")
    assert load_settings().alert_events == {"FAILED", "MISSED"}


def test_an_unknown_alert_event_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_ALERT_EVENTS", "FAILED,COMPLETED")
    assert "SCHEDULER_ALERT_EVENTS" in str(error) and "'COMPLETED'" in str(error)


def test_alert_events_naming_nothing_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "names no event" in str(refusal(monkeypatch, "SCHEDULER_ALERT_EVENTS", " , "))


@pytest.mark.parametrize(
    "url",
    [
        f"ftp://user:{PASSWORD}@hooks.example.com/x",
        f"https://user:{PASSWORD}@/no-host",
        f"http://user:{PASSWORD}@hooks.example.com:99999/x",
        "hooks.example.com/x",
    ],
)
def test_a_bad_webhook_url_is_refused_without_printing_its_password(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    error = refusal(monkeypatch, "SCHEDULER_ALERT_WEBHOOK_URL", url)
    assert str(error).startswith("SCHEDULER_ALERT_WEBHOOK_URL")
    assert PASSWORD not in str(error)


def test_a_webhook_url_with_a_password_is_kept_whole_but_printed_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"https://bot:{PASSWORD}@hooks.example.com:8443/slotcron?key=abc#x"
    monkeypatch.setenv("SCHEDULER_ALERT_WEBHOOK_URL", url)
    settings = load_settings()
    assert settings.alert_webhook_url is not None
    assert settings.alert_webhook_url.get_secret_value() == url
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings)
    assert safe_url(url) == "https://hooks.example.com:8443/slotcron"


def test_alert_is_a_job_option_stored_with_the_job() -> None:
    registry = Registry()

    @cron("* * * * *", name="quiet", alert=False, registry=registry)
    async def quiet() -> None: ...

    @every(seconds=5, name="loud", registry=registry)
    async def loud() -> None: ...

    jobs = {job.name: job for job in registry}
    assert jobs["quiet"].alert is False and jobs["quiet"].options()["alert"] is False
    assert jobs["loud"].alert is True


def test_alert_must_be_true_or_false() -> None:
    with pytest.raises(InvalidJobError) as caught:

        @every(seconds=5, name="odd", alert="no", registry=Registry())  # type: ignore[arg-type]
        async def odd() -> None: ...

    assert "'odd'" in str(caught.value) and "alert" in str(caught.value)


def run_of(job: str, error: str | None) -> RunEvent:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    return RunEvent(job, moment, 7, 1, "cron", "me", "FAILED", error=error)


@pytest.mark.parametrize(("text", "kept"), SHAPES, ids=[kept for _, kept in SHAPES])
async def test_every_secret_shape_is_masked_in_an_alerts_text_fields(text: str, kept: str) -> None:
    """The error (a traceback's end) and every other text of the event."""
    async with webhook() as listener:
        sender = Webhook(Settings(alert_webhook_url=listener.url), alerting={}, clock=SystemClock())
        await sender.start()
        try:
            sender.failed(run_of("alerts.leaky", text))
            sender.fenced(run_of("alerts.fenced", None), f"its lease lapsed; {text}")
            await wait_for(lambda: len(listener.accepted) >= 2, timeout=10, what="both events")
        finally:
            await sender.stop()
    for post in listener.accepted:
        assert SECRET.encode() not in post.raw, post.raw
        assert kept in post.body["error"]
