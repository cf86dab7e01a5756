"""Masking: every common secret shape in free text becomes ``***``, the text around it stays
readable, and no input makes it slow."""

from __future__ import annotations

import time

import pytest
from slotcron.config import mask_url_text
from slotcron.masking import MASK, is_secret_name, mask, mask_value

SECRET = "Hunter2-s3cret"

# (text holding SECRET, what must remain of it): one line per shape the masking knows.
SHAPES = [
    (f"connect postgresql://app:{SECRET}@db.example/x failed", "postgresql://app:***@db.example/x"),
    (f"mysql://root:p@{SECRET}@@db/x: refused", "mysql://root:***@db/x"),  # unencoded "@"
    (f"redis://:{SECRET}@cache:6379/0 down", "redis://:***@cache:6379/0"),
    (f"GET /api?token={SECRET}&page=2 answered 500", "?token=***&page=2"),
    (f"GET /api?password={SECRET}", "?password=***"),
    (f"password={SECRET}, user=bob", "password=***, user=bob"),
    (f"PASSWORD = {SECRET}", "PASSWORD = ***"),
    (f"passwd={SECRET}", "passwd=***"),
    (f"pwd={SECRET};", "pwd=***"),
    (f"token={SECRET}", "token=***"),
    (f"secret={SECRET}", "secret=***"),
    (f"api_key={SECRET}", "api_key=***"),
    (f"apikey={SECRET}", "apikey=***"),
    (f"api-key={SECRET}", "api-key=***"),
    (f"DB_PASSWORD={SECRET} HOST=db", "DB_PASSWORD=*** HOST=db"),
    (f"client_secret={SECRET}", "client_secret=***"),
    (f"access_token={SECRET}", "access_token=***"),
    (f"aws_secret_access_key={SECRET}", "aws_secret_access_key=***"),
    (f"password: {SECRET}", "password: ***"),
    (f"X-Api-Key: {SECRET}", "X-Api-Key: ***"),
    (f"X-Auth-Token:{SECRET}", "X-Auth-Token:***"),
    (f'{{"password": "{SECRET}", "user": "bob"}}', '{"password": "***", "user": "bob"}'),
    (f'{{"api_key":"{SECRET}\\"still"}}', '{"api_key":"***"}'),  # an escaped quote inside
    (f"{{'token': '{SECRET}', 'n': 1}}", "{'token': '***', 'n': 1}"),
    (f'body {{\\"secret\\": \\"{SECRET}\\"}}', 'body {\\"secret\\": \\"***\\"}'),  # JSON in JSON
    (f'password="{SECRET} and the rest, cut', 'password="***'),  # a value cut before its quote
    (f"Authorization: Bearer {SECRET}", "Authorization: Bearer ***"),
    (f"authorization: basic {SECRET}", "authorization: basic ***"),
    (f"Authorization: {SECRET}", "Authorization: ***"),
    (f"Proxy-Authorization: Token {SECRET}", "Proxy-Authorization: Token ***"),
    (f"{{'Authorization': 'Bearer {SECRET}'}}", "{'Authorization': 'Bearer ***'}"),
    (f"sent Bearer {SECRET} twice", "sent Bearer *** twice"),
    ("Basic dXNlcjpIdW50ZXIy", "Basic ***"),
    ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "Bearer ***"),
    ("bearer abcdefghijklmnopqrstuvwxyz", "bearer ***"),  # lower-case letters only, but long
]


@pytest.mark.parametrize(("text", "kept"), SHAPES, ids=[kept for _, kept in SHAPES])
def test_every_secret_shape_is_hidden_and_the_text_around_it_kept(text: str, kept: str) -> None:
    masked = mask(text)
    assert SECRET not in masked and "Hunter2" not in masked and "dXNlcjpIdW50ZXIy" not in masked
    assert "eyJhbGciOi" not in masked and "abcdefghijklmnop" not in masked
    assert kept in masked
    assert mask(masked) == masked, "masking twice changes nothing more"


@pytest.mark.parametrize(
    "text",
    [
        "examples.flaky slot 2026-11-22T03:20:30+00:00 FAILED: RuntimeError: upstream said 503",
        "missing Authorization: Bearer <an admin token>",  # our own 401: a placeholder
        "reads need the bearer token SCHEDULER_ADMIN_TOKEN",
        "SCHEDULER_ADMIN_TOKEN: the token is shorter than 16 characters",  # a variable's name
        "Basic authentication failed; Bearer token missing",
        "max_tokens=5 password_hash=abc fencing_token=17 tokens: 3",
        "http://10.0.3.7:8080/ answered; mail ops@example.com",
        "job 'tenant/alpha': every: must be at least 1 second",
    ],
)
def test_text_without_a_secret_comes_back_unchanged(text: str) -> None:
    assert mask(text) == text


def test_known_secrets_are_hidden_by_value_wherever_they_are() -> None:
    assert mask(f"the key is {SECRET}.", secrets=[SECRET, ""]) == "the key is ***."


def test_it_is_a_superset_of_the_configurations_url_masking() -> None:
    for text in (
        f"connect postgresql://app:p@{SECRET}@@db/x failed; mail ops@example.com",
        f"mysql+aiomysql://u@db/x?password={SECRET}&charset=utf8mb4",
        f"sqlite:///x.db?pwd={SECRET}",
    ):
        assert SECRET not in mask(text)
        assert mask(text) == mask(mask_url_text(text))


def test_structures_are_masked_through_and_secret_named_fields_hidden_whole() -> None:
    value = {
        "password": 1234,
        "nested": [{"api_key": "k"}, f"token={SECRET}"],
        "fencing_token": 17,  # a counter, named like a secret
        "Authorization": "Bearer x",
        "note": None,
        "password_hint": "none",
    }
    assert mask_value(value) == {
        "password": MASK,
        "nested": [{"api_key": MASK}, "token=***"],
        "fencing_token": 17,
        "Authorization": MASK,
        "note": None,
        "password_hint": "none",
    }
    assert value["password"] == 1234, "the argument is left as it was"
    assert is_secret_name("DB_Password") and not is_secret_name("max_tokens")


@pytest.mark.parametrize(
    "hostile",
    [
        "://" * 30_000,
        "://a:" * 20_000 + "@",
        "x" * 60_000 + "://" + "y" * 60_000 + "@",
        'password="' + "\\x" * 40_000,
        "token=" * 20_000,
        "Bearer " * 20_000,
        "authorization: " * 10_000,
        "A" * 200_000,
    ],
    ids=["schemes", "users", "one-url", "escapes", "keys", "bearers", "headers", "plain"],
)
def test_no_input_makes_masking_slow(hostile: str) -> None:
    """A job's error text can be anything; a log line must not cost the loop seconds."""
    started = time.perf_counter()
    mask(hostile)
    assert time.perf_counter() - started < 2.0  # backtracking would take minutes
