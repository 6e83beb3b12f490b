"""From token ids to the text a client sees, piece by piece, with stop strings.

Text is decoded from all of a sequence's tokens each time (a byte-level token may be half a
character; decoding the whole keeps multi-byte characters intact) and only what is certain
goes out: nothing ending in a broken character, and nothing that could still turn into a
stop string. A stop string ends the completion and is not part of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mesh.compat import StrEnum


class Finish(StrEnum):
    """Why a completion ended (OpenAI's ``finish_reason``)."""

    STOP = "stop"  # end of text or a stop string
    LENGTH = "length"  # max_tokens


@dataclass
class TextStream:
    decode: Callable[[Sequence[int]], str]
    stops: tuple[str, ...] = ()
    sent: int = 0  # characters of the text already handed out
    text: str = ""
    finish: Finish | None = field(default=None)

    def feed(self, ids: Sequence[int], *, eos: bool, at_limit: bool) -> str:
        """The new text after the sequence grew to ``ids``; sets ``finish`` once it ends."""
        text = self.decode(ids)
        cut = min((i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stops) if i >= 0),
                  default=-1)
        if cut >= 0:
            text, self.finish = text[:cut], Finish.STOP
        elif eos:
            self.finish = Finish.STOP
        elif at_limit:
            self.finish = Finish.LENGTH
        self.text = text
        end = len(text)
        if self.finish is None:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1  # half a character: wait for its other bytes
            hold = max((len(s) - 1 for s in self.stops), default=0)
            for k in range(min(hold, end - self.sent), 0, -1):
                if any(s.startswith(text[end - k:end]) for s in self.stops):
                    end -= k  # could be the start of a stop string
                    break
        piece = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece
