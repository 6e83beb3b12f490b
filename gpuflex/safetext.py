"""Peer text made safe for a terminal: what the CLI prints and the node logs.

A job's name, a peer's NodeInfo, an error that quotes a spec: all of it was typed on someone
else's machine. Written raw, ``\\x1b[2J`` clears the operator's screen, ``\\r`` overwrites a
line with a forged one, and a bidirectional override makes text read backwards. So such text
is passed through :func:`printable`, which keeps every visible character and shows every
control or formatting character as an escape, and bounds the length. ``--json`` output needs
none of this: JSON escapes control characters itself.

Text this node sends to its peers must not tell them more about the machine than the job
needs: :func:`without_paths` takes the local file paths out of an error message before it
leaves the node.
"""

from __future__ import annotations

import re

#: Characters of one piece of peer text in a line of output.
MAX_CHARS = 200
# C0 and C1 controls, DEL, zero-width and bidirectional formatting, line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: object, limit: int | None = MAX_CHARS, *, keep_newlines: bool = False) -> str:
    """``value`` as one line (or, with ``keep_newlines``, lines) of inert text, clipped to
    ``limit`` characters (None: no limit)."""
    text = value if isinstance(value, str) else str(value)
    text = (_UNSAFE_KEEP_LINES if keep_newlines else _UNSAFE).sub(_escape, text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


# One component of a path as an error message quotes it: up to a space, a quote, a separator or
# the punctuation that ends a quoted path (``'/a/b'``, ``(/a/b)``, ``/a/b:12``, ``/a/b, ...``).
_PART = r"[^\s/\\'\"`,;:()\[\]{}<>|]+"
#: How a home-directory path and a Windows drive path begin (``~/``, ``~alice\``, ``C:\``,
#: ``d:/``): the same in a quoted path and a bare one.
_HOME = r"~[\w.-]*[/\\]"
_DRIVE = r"[A-Za-z]:[/\\]"
_LOCAL_PATH = re.compile(
    # A POSIX path of two or more components (or a file:// address of one), at the start of a
    # word: not after a letter, digit, slash or backslash, so that a relative path data/x.npz
    # and a ratio 3/4 are left alone, and a web address's //host/a/b too (after its colon).
    rf"(?:file://|(?<![\w/\\])(?:(?<!:)/+)?)/{_PART}(?:/+{_PART})+/*"
    # A home directory, the user's own or a named one: ~/x, ~alice/x.
    rf"|(?<![\w/\\]){_HOME}[/\\]*(?:{_PART}(?:[/\\]+{_PART})*[/\\]*)?"
    # A Windows path on a drive, with either separator (C:\Users\x, C:/Users/x), or on a share
    # (\\host\share\x); an exception's repr doubles each backslash, hence the runs of them.
    rf"|(?<![\w/\\]){_DRIVE}[/\\]*(?:{_PART}(?:[/\\]+{_PART})*[/\\]*)?"
    rf"|(?<![\w/\\])\\{{2,}}{_PART}(?:\\+{_PART})+\\*"
)
#: A quoted absolute path, spaces and all, up to its closing quote: how Python's errors quote a
#: file name (``No such file or directory: '/home/alice/My Files/x.npz'``).
_QUOTED_PATH = re.compile(
    r"""(?P<q>['"])(?:file://)?"""
    rf"""(?:/[^'"\n/]+/|{_HOME}|{_DRIVE}|\\{{2,}}[^'"\n\\]+\\)[^'"\n]*(?P=q)"""
)
#: What :func:`without_paths` puts where a path was.
PATH_MARK = "<path>"


def without_paths(text: str) -> str:
    """``text`` with every absolute local path in it replaced by ``<path>``.

    A job's error on this node travels to its peers (presence says why the job failed here),
    and an exception quotes paths: ``No such file or directory: '/home/alice/data/x.npz'``
    tells every peer the operator's user name and how the disk is laid out. The path goes as a
    whole, its file name too: the last component can be the user name itself
    (``/home/alice``, ``C:\\Users\\alice``) or a file the operator named, and the operator reads
    the full message in ``job status`` on this node, which keeps it. Peers need only the kind of
    failure. Relative paths stay (they say nothing about the machine). A quoted path goes up to
    its closing quote, spaces and all; an unquoted one is cut at a space: in
    ``/home/alice/My Files/x`` the part ``Files/x`` stays, after ``<path>``.
    """
    text = _QUOTED_PATH.sub(lambda m: f"{m['q']}{PATH_MARK}{m['q']}", text)
    return _LOCAL_PATH.sub(PATH_MARK, text)


def plural(count: object, word: str, words: str | None = None) -> str:
    """"1 peer", "2 peers" (``words`` for an irregular plural); a count that is not an
    integer (a peer's odd value) reads as it is, with the plural."""
    many = words or word + "s"
    return f"{count} {word if count == 1 and not isinstance(count, bool) else many}"


#: How many trailing characters of a peer id the CLI and the portal show ("…" + these): one
#: length everywhere, so an id read off one can be found in the other.
SHORT_ID_CHARS = 10
