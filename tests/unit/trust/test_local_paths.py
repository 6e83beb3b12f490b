"""What a node tells its peers about a failure names no local path: the user name and the
directories in an error message stay on the node (``safetext.without_paths``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.safetext import PATH_MARK, without_paths

#: A user name, from letters no surrounding text below uses: wherever it shows, a path leaked.
USERS = st.from_regex(r"[A-Z][A-Z0-9._-]{0,11}", fullmatch=True)
PARTS = st.lists(st.from_regex(r"[a-z0-9_.-]{1,12}", fullmatch=True), max_size=4)
#: The prose around a path: no capital letter, no slash, backslash or tilde.
PROSE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 .,:;!?()[]'\"=\n", max_size=40)
#: What an error message puts just before a path it quotes.
BEFORE = st.sampled_from([" ", "'", '"', "(", "=", ": ", "\n", "[", "file:"])


def home(user: str, style: str, parts: list[str]) -> str:
    """A path under ``user``'s home directory, as each system writes it (and as a Python
    exception's repr does, backslashes doubled)."""
    return {
        "linux": "/".join(["/home", user, *parts]),
        "mac": "/".join(["/Users", user, *parts]),
        "tilde": "/".join([f"~{user}", *(parts or ["x"])]),  # ~alice alone is no path here
        "file": "/".join(["file:///home", user, *parts]),
        "windows": "\\".join(["C:\\Users", user, *parts]),
        "windows-slash": "/".join(["d:/Users", user, *parts]),
        "windows-repr": "\\\\".join(["C:\\\\Users", user, *parts]),
        "share": "\\".join(["\\\\fileserver", user, *parts]),
    }[style]


STYLES = st.sampled_from(["linux", "mac", "tilde", "file", "windows", "windows-slash", "windows-repr", "share"])


@settings(max_examples=300, deadline=None)
@given(USERS, STYLES, PARTS, PROSE, BEFORE, PROSE)
def test_no_user_name_survives_in_a_path_however_it_is_quoted(
        user: str, style: str, parts: list[str], head: str, before: str, tail: str) -> None:
    path = home(user, style, parts)
    for message in (f"{head}{before}{path}{tail}", f"{path}{tail}"):
        shown = without_paths(message)
        assert user not in shown and PATH_MARK in shown, (message, shown)


#: Directory and file names with spaces in them ("My Files"), in capitals: none may show.
SPACED = st.lists(st.from_regex(r"[A-Z][A-Z0-9 ._-]{0,11}", fullmatch=True), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(USERS, STYLES, SPACED, PROSE, st.sampled_from(["'", '"']), PROSE)
def test_a_quoted_path_goes_whole_spaces_and_all(user: str, style: str, parts: list[str], head: str, quote: str,
                                                 tail: str) -> None:
    """How Python's errors quote a file name: the whole path, up to its closing quote."""
    shown = without_paths(f"{head} {quote}{home(user, style, parts)}{quote} {tail}")
    assert shown == without_paths(f"{head} {quote}{PATH_MARK}{quote} {tail}"), shown


@settings(max_examples=200, deadline=None)
@given(PROSE)
def test_text_with_no_path_is_left_as_it_is(text: str) -> None:
    assert without_paths(text) == text


@pytest.mark.parametrize("message,shown", [
    ("FileNotFoundError: [Errno 2] No such file or directory: '/home/alice/data/x.npz'",
     "FileNotFoundError: [Errno 2] No such file or directory: '<path>'"),
    ("cannot read ~/data/x.npz: truncated", "cannot read <path>: truncated"),
    ("No such file: 'C:\\\\Users\\\\alice\\\\x.npz'", "No such file: '<path>'"),
    ("No such file or directory: '/home/alice/My Files/x.npz'", "No such file or directory: '<path>'"),
    ('cannot open "C:\\Users\\Alice Smith\\d.csv" (denied)', 'cannot open "<path>" (denied)'),
    ("an unquoted /home/alice/My Files/x is cut at the space", "an unquoted <path> Files/x is cut at the space"),
    ("in /srv/jobs/a/model.py:12, (/var/tmp/x)", "in <path>:12, (<path>)"),
    # Not local paths: said as they are.
    ("data/x.npz not found", "data/x.npz not found"),
    ("3/4 of the batch", "3/4 of the batch"),
    ("cannot fetch https://example.org/data/x.npz", "cannot fetch https://example.org/data/x.npz"),
    ("/tmp is full", "/tmp is full"),
    ("the model needs 9 GiB and this device has 4", "the model needs 9 GiB and this device has 4"),
])
def test_what_is_a_local_path_and_what_is_not(message: str, shown: str) -> None:
    assert without_paths(message) == shown
