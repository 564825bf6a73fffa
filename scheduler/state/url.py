"""Where a long-running process finds its state store URL without putting the password in its
command line (``ps`` and ``/proc/<pid>/cmdline`` show a process's arguments to every local
user; Kubernetes expands ``$(VAR)`` in ``args`` into exactly that).

Order: ``--state URL`` (for local use; warned when it holds a password), ``--state-file PATH``
(a mounted Secret: the file holds the URL), ``$SCHEDULER_STATE`` (a variable the process reads
itself), else the command's default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

STATE_ENV = "SCHEDULER_STATE"
# A URL file larger than this is not a URL.
MAX_URL_BYTES = 4096


class StateUrlError(ValueError):
    """The URL cannot be read; the message names the flag or file."""


@dataclass(frozen=True)
class StateUrl:
    url: str
    # Where it came from: "--state", "--state-file PATH", "$SCHEDULER_STATE" or "default".
    source: str

    @property
    def has_password(self) -> bool:
        return has_password(self.url)

    @property
    def shown(self) -> str:
        return redacted(self.url)


def has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and messages)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
        return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))
    except ValueError:
        return "<a URL that does not parse>"


def resolve_state_url(given: str | None, file: Path | None, default: str) -> StateUrl:
    """The store URL from the flag, the file or the environment (``StateUrlError`` naming the
    flag or the file when it cannot be used)."""
    if given is not None and file is not None:
        raise StateUrlError("--state and --state-file: give one (--state-file keeps the password out of ps)")
    if given is not None:
        return StateUrl(given, "--state")
    if file is not None:
        try:
            raw = file.read_bytes()[: MAX_URL_BYTES + 1]
        except OSError as exc:
            raise StateUrlError(f"--state-file {file}: cannot read: {exc.strerror or exc}") from None
        if len(raw) > MAX_URL_BYTES:
            raise StateUrlError(f"--state-file {file}: more than {MAX_URL_BYTES} bytes: not a URL")
        try:
            url = raw.decode().strip()
        except UnicodeDecodeError:
            raise StateUrlError(f"--state-file {file}: not UTF-8 text") from None
        if not url or "\n" in url:
            raise StateUrlError(f"--state-file {file}: expected one line, the URL (e.g. redis://USER:PASSWORD@HOST:6379/0)")
        return StateUrl(url, f"--state-file {file}")
    env = os.environ.get(STATE_ENV, "").strip()
    if env:
        return StateUrl(env, f"${STATE_ENV}")
    return StateUrl(default, "default")
