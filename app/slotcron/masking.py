"""Secrets hidden in free text: what reaches a log line, an alert, a span or an API error.

Error text is written by jobs, drivers and libraries, and it quotes what they were given: a
connection URL, a request's headers, a configuration dump. :func:`mask` replaces the value of
every common secret shape with ``***`` and keeps the rest, so the text still says what went
wrong:

- a URL's password, ``scheme://user:PASSWORD@host`` (everything up to the URL's *last* ``@``,
  so a password holding an unencoded ``@`` is hidden whole);
- the value of a key named like a secret: ``password``, ``passwd``, ``pwd``, ``token``,
  ``secret``, ``api_key``/``apikey``/``api-key``, ``secret_key``, ``private_key``,
  ``access_key``, alone or at the end of a longer name (``DB_PASSWORD``, ``client_secret``,
  ``X-Auth-Token``, ``access_token``), written ``key=value`` (a query string, a DSN, an
  environment dump), ``key: value`` (YAML, a header), ``"key": "value"`` (JSON) or
  ``'key': 'value'`` (a Python dict's repr);
- the credentials of an ``Authorization:`` header, whatever its scheme;
- ``Bearer …`` and ``Basic …`` credentials elsewhere, when the word after them looks like a
  credential rather than prose (``Basic dXNlcjpwYXNz`` is hidden, "Basic authentication"
  is not).

What it cannot know is a secret written without any of these shapes ("the key is hunter2"):
callers that know a secret's value pass it in ``secrets``.

``slotcron.config.mask_url_text`` covers the first shape and ``password``/``passwd``/``pwd`` in a
query string; this is a superset of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

MASK = "***"

# One URL and what follows it up to white space or a quote; its password is what lies between
# the user's ":" and the run's last "@" (a password may hold an unencoded "@").
_URL_RUN = re.compile(r"://[^\s'\"]*")
_USER_END = re.compile(r"[:/@]")

# The patterns below are matched against the text lower-cased (case-insensitive matching made
# every log line several times slower), and their replacements are cut from the text itself.
_SECRET_WORD = (
    r"(?:password|passwd|pwd|token|secret|api[_-]?key|apikey"
    r"|secret[_-]?key|private[_-]?key|access[_-]?key)"
)
_SECRET_NAME = re.compile(rf"[a-z0-9_.-]*?{_SECRET_WORD}")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_NOT_SECRETS = frozenset({"fencing_token"})
"""Names that end like a secret's and are not one (``ctx.fencing_token`` is a counter)."""
# From the secret word on (the name's start is found by the callback, so the scan stays
# linear); the word must end the name: password_hash and max_tokens are other things. A quoted
# value runs to its closing quote (escapes skipped: JSON, or JSON inside a string), or to the
# end of the line when the text was cut before it; an unquoted one to white space, "&" or a
# quote, trailing closing punctuation left out. No part can match one character two ways: a
# value that never ends costs one pass, not an exponential search.
_KEY_VALUE = re.compile(
    rf"{_SECRET_WORD}(?![a-z0-9])(?P<kq>\\?[\"']?)(?P<sep>[ \t]*[:=][ \t]*)"
    r"(?:(?P<vq>\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|\\\"[^\"\n]*?\\\"|\\'[^'\n]*?\\')"
    r"|(?P<open>\\?[\"'])[^\n]*"
    r"|[^\s&'\"]+?(?=[,;.)}\]]*(?:[\s&'\"]|$)))",
    re.M,
)
_SCHEMES = r"(?:bearer|basic|token|digest|negotiate|ntlm|apikey)"
_AUTHORIZATION = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization\\?[\"']?[ \t]*[:=][ \t]*\\?[\"']?"
    rf"(?:{_SCHEMES}[ \t]+)?)"
    # Not the scheme itself: "Authorization: Bearer <token>" shows a placeholder, no credential.
    rf"(?!{_SCHEMES}[ \t])(?P<credential>[a-z0-9\-._~+/]+=*)"
)
_SCHEME_CREDENTIAL = re.compile(
    r"(?P<head>\b(?:bearer|basic)[ \t]+)(?P<credential>[a-z0-9\-._~+/]+=*)"
)
_PROSE = re.compile(r"[A-Za-z][a-z]*")
"""A word after ``Bearer``/``Basic`` that reads as prose ("Bearer token", "Basic Auth"), not a
credential: base64 and token alphabets almost always show a digit, a capital past the first
letter, or punctuation; and a credential made of lower-case letters only is long."""
_HEADERS = ("authorization", "proxy-authorization")
_KEY_WORDS = ("pass", "pwd", "token", "secret", "key")

_Replace = Callable[[re.Match[str], str], str]


def _url(match: re.Match[str]) -> str:
    run = match.group()
    at = run.rfind("@")
    scheme = 0  # where the URL under test starts ("://"); a run may hold a URL in a URL
    while 0 <= scheme < at:
        user_end = _USER_END.search(run, scheme + 3)
        if user_end is not None and run[user_end.start()] == ":" and user_end.start() < at:
            return run[: user_end.start() + 1] + MASK + run[at:]
        scheme = run.find("://", scheme + 3)
    return run


def _authorization(match: re.Match[str], text: str) -> str:
    return text[match.start() : match.end("head")] + MASK


def _credential(match: re.Match[str], text: str) -> str:
    credential = text[match.start("credential") : match.end("credential")]
    if _PROSE.fullmatch(credential) and len(credential) < 20:
        return text[match.start() : match.end()]
    return text[match.start() : match.end("head")] + MASK


def _key_value(match: re.Match[str], text: str) -> str:
    start = match.start()
    name_start = start
    while name_start > 0 and text[name_start - 1] in _NAME_CHARS:
        name_start -= 1
    name = text[name_start : match.start("kq")]
    if name.lower() in _NOT_SECRETS:
        return text[start : match.end()]
    # Configuration errors name a variable before a colon and never quote its value
    # ("SCHEDULER_ADMIN_TOKEN: the token is shorter than 16 characters").
    if ":" in match.group("sep") and name.upper().startswith("SCHEDULER_") and not match["kq"]:
        return text[start : match.end()]
    head = text[start : match.end("sep")]
    quoted = match.group("vq")
    if quoted is not None:
        quote = quoted[:2] if quoted.startswith("\\") else quoted[0]
        return f"{head}{quote}{MASK}{quote}"
    return head + (match.group("open") or "") + MASK


def _substitute(pattern: re.Pattern[str], replace: _Replace, text: str) -> str:
    low = text.lower()
    if len(low) != len(text):  # a few characters lower-case to two: match the text as it is
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    parts: list[str] = []
    end = 0
    for match in pattern.finditer(low):
        parts += (text[end : match.start()], replace(match, text))
        end = match.end()
    if not parts:
        return text
    parts.append(text[end:])
    return "".join(parts)


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret shape above (and every string of ``secrets``) replaced by
    ``***``. Idempotent; text without a secret comes back unchanged (and quickly: a line with
    none of the shapes' words costs a lower-casing and a few substring tests)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    if "://" in text:
        text = _URL_RUN.sub(_url, text)
    low = text.lower()
    if "authorization" in low:
        text = _substitute(_AUTHORIZATION, _authorization, text)
    if "bearer" in low or "basic" in low:
        text = _substitute(_SCHEME_CREDENTIAL, _credential, text)
    if any(word in low for word in _KEY_WORDS):
        text = _substitute(_KEY_VALUE, _key_value, text)
    return text


def is_secret_name(name: str) -> bool:
    """Whether a field named ``name`` holds a secret (``password``, ``api_key``,
    ``client_secret`` …): its value is hidden whole, whatever it is."""
    low = name.lower()
    if low in _NOT_SECRETS:
        return False
    return bool(_SECRET_NAME.fullmatch(low)) or low in _HEADERS


def mask_value(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (a structure of dicts, lists and scalars, as JSON holds) with :func:`mask`
    applied to every string in it, and the whole value of every key named like a secret
    hidden. Containers are copied; the argument is left as it was."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return mask(value, secrets)
    if isinstance(value, dict):
        return {
            k: (
                MASK
                if isinstance(k, str) and is_secret_name(k) and v is not None
                else mask_value(v, secrets)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_value(item, secrets) for item in value]
    return value
