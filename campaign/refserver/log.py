"""The server's log: one line per event on stdout, flushed at once, timestamps in SGLang's shape.

``[2026-12-02 12:00:00] Load weight begin. avail mem=...``: the campaign tool follows this stream from a file and
matches the same phase markers it uses for SGLang, so every line is flushed as it is written.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOG_FORMAT = "[%(asctime)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

logger = logging.getLogger("refserver")


class _FlushingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that flushes after every record (StreamHandler does, but only for its own stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.flush()


def configure_logging() -> None:
    """Send the server's records to stdout in SGLang's line shape."""
    handler = _FlushingHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's logging config in the same line shape, so its own lines (bind errors, ``Uvicorn running on``) match."""
    formatter = {"()": "logging.Formatter", "fmt": LOG_FORMAT, "datefmt": DATE_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": formatter},
        "handlers": {"stdout": handler},
        "loggers": {
            "uvicorn": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            # One line per request would drown the decode lines; errors still show.
            "uvicorn.access": {"handlers": ["stdout"], "level": "WARNING", "propagate": False},
        },
    }
