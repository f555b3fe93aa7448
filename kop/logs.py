"""The broker's log lines: `text` (one human-readable line per event) or `json` (one JSON object per line, for log
collectors). Fields a log call passes with `extra=` (a request's `client_id` and `addr`, ...) follow the message as
`key=value` in text, and are keys of their own in JSON."""
import json
import logging
import sys
from datetime import datetime, timezone

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = extra_fields(record)
        if not fields:
            return line
        head, sep, trace = line.partition("\n")  # the fields stay on the event's line, before any traceback
        return head + "".join(f" {k}={v}" for k, v in fields.items()) + sep + trace


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(extra_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at `level` in `log_format` (one of LOG_FORMATS)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATTERS[log_format]())
    logging.basicConfig(level=level, handlers=[handler])
