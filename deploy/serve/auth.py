"""API keys of ``zoo serve``: read once at start-up (never at import), kept only as SHA-256
digests, checked in constant time, one scope per route group; and the refusal to expose a
server without one.

A key file has one key a line, optionally followed by the scopes it grants::

    # comments and blank lines are skipped
    3b1f0c2e9d7a4c55a0e1f7b2c9d84e61                 # every scope
    9f8e7d6c5b4a39281706f5e4d3c2b1a0  infer          # inference only
    0a1b2c3d4e5f60718293a4b5c6d7e8f9  metadata,metrics

``ZOO_API_KEY`` (used when no file is given) is one key with every scope. The health
endpoints (live, ready) are always open: an orchestrator's probes carry no key.

Hand-written rather than Starlette's ``AuthenticationMiddleware``: that one answers a user
object per request and leaves the comparison (the part that matters here) to us, and the same
check must also guard the gRPC service, which Starlette never sees."""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import InputError, UsageError

log = logging.getLogger("zoo.serve")

ENV_VAR = "ZOO_API_KEY"
SCOPES = ("infer", "metadata", "metrics")
"""Route groups a key can be granted: ``infer`` (v2 infer, /predict, gRPC ModelInfer),
``metadata`` (server and model metadata and readiness, /openapi.json, the demo page),
``metrics`` (/metrics)."""
MIN_KEY_LENGTH = 16


class Verdict(enum.Enum):
    """What a presented credential is worth for one scope."""

    OK = "ok"
    MISSING = "missing"  # no ``Bearer`` credential: 401
    INVALID = "invalid"  # a key that is not ours: 401
    FORBIDDEN = "forbidden"  # our key, without this scope: 403


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class ApiKeys:
    """The keys a server accepts, as SHA-256 digests with the scopes each grants.

    Args:
        entries: ``(sha256 digest, scopes)`` per key.
    """

    entries: tuple[tuple[bytes, frozenset[str]], ...]

    def __repr__(self) -> str:  # never print digests either
        return f"ApiKeys({len(self.entries)} keys)"

    def scopes_of(self, key: str) -> frozenset[str] | None:
        """The scopes ``key`` grants, None if it is not one of ours.

        Both sides are hashed first, so every comparison is of two 32-byte digests: a key of
        another length takes the same path as a wrong key of the right length, and every
        stored key is compared (no early exit), in :func:`hmac.compare_digest`'s constant time.
        """
        presented = _digest(key)
        found: frozenset[str] | None = None
        for digest, scopes in self.entries:
            if hmac.compare_digest(presented, digest):
                found = scopes
        return found

    def check(self, authorization: str | None, scope: str) -> Verdict:
        """The verdict on an ``Authorization`` header (HTTP) or ``authorization`` metadata
        (gRPC) for a route of ``scope``."""
        token = bearer_token(authorization)
        scopes = self.scopes_of(token or "")  # no token: the same work as a wrong one
        if token is None:
            return Verdict.MISSING
        if scopes is None:
            return Verdict.INVALID
        return Verdict.OK if scope in scopes else Verdict.FORBIDDEN


def bearer_token(authorization: str | None) -> str | None:
    """The credential of ``Bearer <token>`` (the scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def refusal_message(verdict: Verdict, scope: str) -> str:
    """What a refused client is told (never the key it sent)."""
    if verdict is Verdict.MISSING:
        return (
            "this endpoint needs an API key: send 'Authorization: Bearer <key>' (the header; "
            "gRPC: the metadata)"
        )
    if verdict is Verdict.INVALID:
        return "the API key is not valid for this server"
    return f"the API key does not grant the {scope!r} scope this endpoint needs"


def _parse_scopes(text: str, where: str) -> frozenset[str]:
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise InputError(
            f"{where}: unknown scope {unknown[0]!r}; the scopes are {', '.join(SCOPES)} "
            "(comma-separated; none: all of them)"
        )
    return scopes or frozenset(SCOPES)


def _check_key(key: str, where: str) -> None:
    if (
        len(key) < MIN_KEY_LENGTH
        or not key.isascii()
        or not key.isprintable()
        or any(c.isspace() for c in key)
    ):
        raise InputError(
            f"{where}: an API key must be at least {MIN_KEY_LENGTH} printable ASCII characters "
            "without spaces (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )


def parse_key_file(text: str, source: str) -> ApiKeys:
    """The keys of a key file's text (format in the module's docstring).

    Raises:
        InputError: a short or non-ASCII key, an unknown scope, a key given twice, or no key
            at all; the message names the line, never the key.
    """
    entries: dict[bytes, frozenset[str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, rest = line.partition(" ")
        where = f"{source} line {number}"
        _check_key(key, where)
        if _digest(key) in entries:
            raise InputError(f"{where}: this key was already given on an earlier line")
        entries[_digest(key)] = _parse_scopes(rest, where)
    if not entries:
        raise InputError(f"{source} holds no API key: one key a line, optionally its scopes")
    return ApiKeys(tuple(entries.items()))


def load_keys(key_file: str | None, environ: Mapping[str, str] | None = None) -> ApiKeys | None:
    """The server's keys, read now (at start-up): from ``key_file``, else from the
    ``ZOO_API_KEY`` environment variable (every scope), else None (no authentication).

    Args:
        key_file: ``--api-key-file``.
        environ: the environment to read (default: the process's, as it is now).

    Raises:
        InputError: the file is missing or unreadable, or a key in it (or the variable) is
            malformed.
    """
    env = os.environ if environ is None else environ
    if key_file is not None:
        path = Path(key_file)
        try:
            text = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--api-key-file {key_file}: cannot read it ({exc})") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("%s is readable by other users: chmod 600 it", key_file)
        if env.get(ENV_VAR):
            log.warning("%s is set but --api-key-file is given: the file's keys are used", ENV_VAR)
        return parse_key_file(text, key_file)
    key = env.get(ENV_VAR, "").strip()
    if not key:
        return None
    _check_key(key, ENV_VAR)
    return ApiKeys(((_digest(key), frozenset(SCOPES)),))


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only this machine (127.0.0.0/8, ::1, ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # another host name: it may resolve anywhere
        return False


def check_exposure(host: str, keys: ApiKeys | None, *, allow_unauthenticated: bool) -> None:
    """Refuse to serve anyone who can reach ``host`` without a key.

    Raises:
        UsageError: ``host`` is not loopback, no key is set and ``allow_unauthenticated`` is
            not given.
    """
    if keys is None and not allow_unauthenticated and not is_loopback(host):
        raise UsageError(
            f"--host {host} serves other machines, and no API key is set: give "
            f"--api-key-file PATH or set {ENV_VAR}, or pass --allow-unauthenticated to serve "
            "anyone who can reach it",
            param_hint="--host",
        )
