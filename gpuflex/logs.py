"""Node logging: human text or JSON lines, with round context on every round event.

py-libp2p 0.8.1 logs routine conditions (a DHT stream ending cleanly, a store it believes
failed) as warnings; they are demoted so that the node's own warnings stay readable. Log lines
quote peers (a job's name, a refused spec), so text lines are made printable: a line is one
line, and no control character reaches the terminal that shows it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from gpuflex.safetext import printable

_NOISY = ("libp2p", "multiaddr", "async_service", "trio_typing")
_CONTEXT = ("job", "round", "peer", "type")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if isinstance(event, dict):
            for key in _CONTEXT:
                if event.get(key) is not None:
                    out["phase" if key == "type" else key] = event[key]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        text = f"{stamp} {record.levelname.lower():7s} {printable(record.getMessage(), 4000)}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str = "info", fmt: str = "text", logfile: Path | None = None) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logfile))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.CRITICAL)
