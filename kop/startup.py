"""What stops a broker from starting, in words an operator can act on: `kop standalone` prints a StartupError as one
line on stderr and exits with status 2, without a traceback."""
import errno
import os
import socket


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
