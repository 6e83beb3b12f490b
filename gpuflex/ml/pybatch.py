"""A reader for CIFAR's python-batches files that runs no code from them.

The files are pickles, and ``pickle.load`` of a file is ``exec`` of whatever its author chose:
a batch file swapped on disk, or one from an untrusted archive, would own the node. So this
module never calls the unpickler. It walks the opcodes with :func:`pickletools.genops`, which
only decodes them, and interprets the few that these files use: dicts, lists, tuples, ints,
byte and text strings, and the one way numpy pickles a uint8 array (``_reconstruct`` then
``BUILD``, or protocol 5's ``_frombuffer``). Every other global is refused, and the array is
rebuilt here with :func:`numpy.frombuffer` from its checked shape and bytes.

Sizes are bounded: the file (``MAX_FILE_BYTES``), the opcodes read (``MAX_OPS``) and the array
dimensions. It reads files written by Python 2's cPickle (the published CIFAR-10 and -100
archives) and by Python 3 at protocols 2 to 5 (numpy 1 and 2 module names).
"""

from __future__ import annotations

import math
import pickletools
from pathlib import Path
from typing import Any

import numpy as np

from gpuflex.errors import GpuflexError

#: A CIFAR-10 batch is 31 MB and CIFAR-100's training file 155 MB.
MAX_FILE_BYTES = 256 << 20
#: Opcodes read from one file: a batch of 10,000 images takes about 40,000.
MAX_OPS = 5_000_000
MAX_DIMS = 4


class BatchFormatError(GpuflexError, ValueError):
    """The file is not a python-batches pickle of the expected, data-only shape."""


class _Global:
    """A refused-by-default global that this reader knows how to stand in for."""

    def __init__(self, name: str) -> None:
        self.name = name


_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): "reconstruct",
    ("numpy._core.multiarray", "_reconstruct"): "reconstruct",
    ("numpy.core.numeric", "_frombuffer"): "frombuffer",
    ("numpy._core.numeric", "_frombuffer"): "frombuffer",
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
    ("_codecs", "encode"): "encode",  # Python 3 writes bytes as encode(text, 'latin1') at protocol 2
    ("__builtin__", "bytes"): "bytes",  # ... and b'' as bytes()
    ("builtins", "bytes"): "bytes",
}
_DTYPES = {"u1": np.dtype(np.uint8), "|u1": np.dtype(np.uint8)}


class _Dtype:
    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype


class _PendingArray:
    """``_reconstruct(ndarray, (0,), b'b')``: an empty array that BUILD fills."""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if not isinstance(value, str):
        raise BatchFormatError(f"expected a string, got {type(value).__name__}")
    return value


def _array(raw: Any, dtype: Any, shape: Any, fortran: bool) -> np.ndarray:
    """A view of ``raw`` (never a copy, so a memoised buffer used twice costs nothing)."""
    if not isinstance(dtype, _Dtype):
        raise BatchFormatError("array without a dtype")
    if not isinstance(raw, (bytes, bytearray)):
        raise BatchFormatError(f"array data is a {type(raw).__name__}, not bytes")
    if (not isinstance(shape, tuple) or len(shape) > MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise BatchFormatError(f"array shape {shape!r} is not a tuple of at most {MAX_DIMS} sizes")
    if math.prod(shape) * dtype.dtype.itemsize != len(raw):
        raise BatchFormatError(f"array of shape {shape} does not match its {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype.dtype).reshape(shape, order="F" if fortran else "C")


def _reduce(func: Any, args: Any, budget: list[int]) -> Any:
    if not isinstance(func, _Global) or not isinstance(args, tuple):
        raise BatchFormatError("REDUCE of something other than a known global")
    if func.name == "encode" and len(args) == 2 and _text(args[1]).lower() in ("latin1", "latin-1"):
        text = _text(args[0])
        budget[0] -= len(text)  # a memoised string encoded again and again is a copy each time
        if budget[0] < 0:
            raise BatchFormatError("decodes to more bytes than the file holds")
        return text.encode("latin-1")
    if func.name == "bytes" and args == ():
        return b""
    if func.name == "dtype" and 1 <= len(args) <= 3:
        if _text(args[0]) not in _DTYPES:
            raise BatchFormatError(f"dtype {_text(args[0])[:16]!r} refused: a batch holds uint8 ('u1') arrays")
        return _Dtype(_DTYPES[_text(args[0])])
    if func.name == "reconstruct" and len(args) == 3 and isinstance(args[0], _Global) and args[0].name == "ndarray":
        return _PendingArray()
    if func.name == "frombuffer" and len(args) == 4:
        return _array(args[0], args[1], args[2], _text(args[3]) == "F")
    raise BatchFormatError(f"unexpected call of {func.name} with {len(args)} arguments")


def _build(obj: Any, state: Any) -> Any:
    if isinstance(obj, _Dtype) and isinstance(state, tuple) and len(state) <= 9:
        return obj
    if isinstance(obj, _PendingArray) and isinstance(state, tuple) and len(state) == 5:
        _version, shape, dtype, fortran, raw = state
        return _array(raw, dtype, shape, bool(fortran))
    raise BatchFormatError(f"unexpected BUILD of {type(obj).__name__}")


def _global(module: Any, name: Any) -> _Global:
    key = (_text(module), _text(name))
    if key not in _GLOBALS:
        raise BatchFormatError(f"refusing global {key[0]}.{key[1]}: a python batch holds only data")
    return _Global(_GLOBALS[key])


def _pop_mark(stack: list[Any], marks: list[int]) -> list[Any]:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def _pairs(items: list[Any]) -> list[tuple[Any, Any]]:
    if len(items) % 2:
        raise BatchFormatError("odd number of items for a dict")
    return list(zip(items[::2], items[1::2], strict=True))


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_LITERALS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
             "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
#: Python 2 ``str``: kept as bytes, as Python 3 reads them with ``encoding="bytes"``.
_PY2_STRINGS = {"BINSTRING", "SHORT_BINSTRING"}
_IGNORED = {"PROTO", "FRAME"}


def parse_batch(data: bytes) -> Any:
    """The object a python-batches pickle holds, built from data alone (see the module doc)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    budget = [len(data)]
    try:
        arg: Any  # an opcode's argument: its type depends on the opcode
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if count >= MAX_OPS:
                raise BatchFormatError(f"more than {MAX_OPS} opcodes")
            name = op.name
            if name in _IGNORED:
                continue
            if name == "STOP":
                if len(stack) != 1 or marks:
                    raise BatchFormatError("unbalanced pickle")
                _only_data(stack[0])
                return stack[0]
            if name in _LITERALS:
                stack.append(arg)
            elif name in _PY2_STRINGS:
                stack.append(str(arg).encode("latin-1"))
            elif name in _CONSTANTS:
                stack.append(_CONSTANTS[name])
            elif name == "BYTEARRAY8":
                stack.append(bytes(arg))
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                popped = tuple(stack[-n:])
                if len(popped) != n:
                    raise BatchFormatError("stack underflow")
                del stack[-n:]
                stack.append(popped)
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack, marks)))
            elif name == "LIST":
                stack.append(_pop_mark(stack, marks))
            elif name == "DICT":
                stack.append(dict(_pairs(_pop_mark(stack, marks))))
            elif name == "APPEND":
                value = stack.pop()
                _expect(stack[-1], list).append(value)
            elif name == "APPENDS":
                items = _pop_mark(stack, marks)
                _expect(stack[-1], list).extend(items)
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                _expect(stack[-1], dict)[key] = value
            elif name == "SETITEMS":
                items = _pop_mark(stack, marks)
                _expect(stack[-1], dict).update(_pairs(items))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[int(arg)])
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                stack.append(_global(module, attr))
            elif name == "STACK_GLOBAL":
                attr, module = stack.pop(), stack.pop()
                stack.append(_global(module, attr))
            elif name == "REDUCE":
                args, func = stack.pop(), stack.pop()
                stack.append(_reduce(func, args, budget))
            elif name == "BUILD":
                state = stack.pop()
                stack[-1] = _build(stack[-1], state)
            else:
                raise BatchFormatError(f"opcode {name} has no place in a python batch")
    except BatchFormatError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise BatchFormatError(f"not a well-formed pickle: {type(exc).__name__}: {exc}") from None
    raise BatchFormatError("the pickle has no STOP")


def _only_data(root: Any) -> None:
    """No stand-in (a global, a dtype, an unbuilt array) may be left in the result."""
    todo, seen = [root], set()
    while todo:
        item = todo.pop()
        if isinstance(item, (_Global, _Dtype, _PendingArray)):
            raise BatchFormatError(f"a bare {type(item).__name__.strip('_').lower()} is not data")
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            todo.extend(item.values() if isinstance(item, dict) else item)
            if isinstance(item, dict):
                todo.extend(item.keys())


def _expect(obj: Any, kind: type) -> Any:
    if not isinstance(obj, kind):
        raise BatchFormatError(f"expected a {kind.__name__}, found a {type(obj).__name__}")
    return obj


def read_batch(path: Path) -> dict[Any, Any]:
    """Read one batch file (at most ``MAX_FILE_BYTES``) into a dict of plain values and arrays."""
    with path.open("rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise BatchFormatError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
    obj = parse_batch(data)
    if not isinstance(obj, dict):
        raise BatchFormatError(f"holds a {type(obj).__name__}, not a dict")
    return obj
