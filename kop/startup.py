"""What stops a broker from starting, in words an operator can act on: `kop standalone` prints a StartupError as one
line on stderr and exits with status 2, without a traceback."""
import contextlib
import errno
import os
import socket
from collections.abc import Iterator

from google.protobuf.message import DecodeError


class StartupError(Exception):
    """A reason the broker cannot start that the operator can fix (a port in use, a data directory in use, ...)."""


# What a bind failure usually means, by errno.
_BIND_HINTS = {
    errno.EADDRINUSE: "another process listens there",
    errno.EADDRNOTAVAIL: "not an address of this machine",
    errno.EACCES: "ports below 1024 need privileges",
}


def bind_failure(exc: OSError, host: str, port: int, purpose: str) -> StartupError:
    """A StartupError for a listening socket that could not be bound (`purpose`: who it was for)."""
    if isinstance(exc, socket.gaierror):
        return StartupError(f"cannot listen on {host}:{port} for {purpose}: unknown host ({exc.strerror})")
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = _BIND_HINTS.get(exc.errno)
    return StartupError(f"cannot listen on {host}:{port} for {purpose}: {reason}" + (f" ({hint})" if hint else ""))


@contextlib.contextmanager
def reading(path: str) -> Iterator[None]:
    """Data the broker loads at start-up: a file it cannot read or parse (damaged by a disk, edited by hand, from
    another program) stops the start with its path and the reason, not a traceback."""
    try:
        yield
    except DecodeError as exc:
        raise StartupError(f"cannot load {path}: not a valid kop file ({exc}); restore it from a backup or move it "
                           f"away") from exc
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot load {path}: {exc}") from exc
