"""Frozen, serialisable messages exchanged between client steps and server steps.

Every message is a frozen dataclass whose fields are numpy arrays, Python scalars
(int, float, bool, str) or ``None``. ``to_bytes`` / ``from_bytes`` round-trip a message
losslessly (dtype, shape and every bit of every array) so the same message can travel
through an in-process call, a Celery task or an HTTP request.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import pkgutil
import zipfile
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

_REGISTRY: dict[str, type[Message]] = {}
#: the only modules a payload's type may name for import: this package's own
_ALGORITHM_MODULES = frozenset(
    f"algorithms.{m.name}" for m in pkgutil.iter_modules([str(Path(__file__).parent)]))


@dataclasses.dataclass(frozen=True)
class Message:
    """Base class of all messages. Subclasses must be ``@dataclass(frozen=True)``."""

    kind: ClassVar[str] = "message"
    #: array fields with one row per user of the tenant's block (a local state's U_i and
    #: anything else derived per user): what :meth:`forget_rows` erases
    user_rows: ClassVar[tuple[str, ...]] = ()
    #: array fields of a server state whose first axis is the client index (row i is
    #: client i's part, e.g. FedMC-ADMM's contributions C): the service stores each
    #: client's rows on their own and rewrites only those a server step changed
    client_parts: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        key = f"{cls.__module__}.{cls.__qualname__}"
        _REGISTRY[key] = cls

    def arrays(self) -> dict[str, np.ndarray]:
        """The array fields of this message, by name (what a DP wrapper clips and noises)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }

    def forget_rows(self, rows: np.ndarray) -> Self:
        """A copy with rows ``rows`` of every :attr:`user_rows` array set to zero: what is
        left of forgotten users in a tenant's local state (a zero row stays zero under
        the algorithms' ridge / weight-decay updates once the user has no ratings)."""
        rows = np.asarray(rows, dtype=np.int64)
        changes: dict[str, Any] = {}
        for name in self.user_rows:
            arr = getattr(self, name)
            if isinstance(arr, np.ndarray) and rows.size:
                arr = arr.copy()
                arr[rows] = 0
                changes[name] = arr
        return self.replace(**changes) if changes else self

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields replaced (messages are immutable)."""
        return dataclasses.replace(self, **changes)

    def nbytes(self) -> int:
        """Payload size of the arrays, in bytes (communication cost)."""
        return int(sum(a.nbytes for a in self.arrays().values()))

    def to_bytes(self) -> bytes:
        """Serialise losslessly: an ``.npz`` archive with the scalars as JSON metadata."""
        arrays: dict[str, np.ndarray] = {}
        scalars: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                arrays[f.name] = value
            elif value is None or isinstance(value, bool | int | float | str):
                scalars[f.name] = value
            else:
                raise TypeError(f"{type(self).__name__}.{f.name}: cannot serialise {type(value)}")
        meta = {"type": f"{type(self).__module__}.{type(self).__qualname__}", "scalars": scalars}
        buf = io.BytesIO()
        np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        return buf.getvalue()

    @staticmethod
    def from_bytes(data: bytes) -> Message:
        """Inverse of :meth:`to_bytes`; the concrete class is recorded in the payload."""
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            meta = json.loads(npz["__meta__"].tobytes().decode())
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
        cls = _message_class(meta["type"])
        if cls is None:
            raise ValueError(f"unknown message type {meta['type']!r}")
        return cls(**arrays, **meta["scalars"])


def _message_class(name: Any) -> type[Message] | None:
    """The registered message class ``name``, importing its algorithm module when this
    process has not run that algorithm yet (only this package's modules)."""
    cls = _REGISTRY.get(name)
    module = str(name).rpartition(".")[0]
    if cls is None and module.startswith("algorithms.") and module in _ALGORITHM_MODULES:
        importlib.import_module(module)
        cls = _REGISTRY.get(name)
    return cls


def messages_equal(a: Message, b: Message) -> bool:
    """Exact equality of two messages, bit for bit on arrays (NaN == NaN)."""
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not isinstance(y, np.ndarray) or x.dtype != y.dtype or x.shape != y.shape:
                return False
            if x.tobytes() != y.tobytes():
                return False
        elif x != y:
            return False
    return True


class MessageRefused(ValueError):
    """Bytes that are not the expected message: ``field`` (None: the message as a whole)
    and what is wrong with it."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(f"{field or 'message'} {problem}")
        self.field, self.problem = field, problem


#: the metadata (type and scalars) of a message is small JSON: more is refused unread
MAX_META_BYTES = 1 << 20


def read_expected(data: bytes, type_name: str, arrays: dict[str, tuple[list[int], set[str]]]
                  ) -> tuple[type[Message], dict[str, Any], dict[str, np.ndarray]]:
    """Read message bytes that must be a ``type_name`` with exactly ``arrays``
    (name -> (shape, allowed dtype names)), inflating nothing it has not checked.

    The archive's member names come from its central directory and every array's shape and
    dtype from its ``.npy`` header, so a wrong name, shape or dtype is refused before any
    array is read; each array is then read as a stream of exactly the bytes its checked
    header implies (a compressed member claiming more is refused at that cap), so a small
    upload cannot inflate to more memory than the expected message takes. Returns
    (class, scalars, arrays); raises :class:`MessageRefused` naming what is wrong.
    """
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise MessageRefused(None, f"is not a fedrec message ({type(exc).__name__}: "
                                   f"{exc})") from None
    with zf:
        names = [n.removesuffix(".npy") for n in zf.namelist()]
        if len(set(names)) != len(names) or "__meta__" not in names:
            raise MessageRefused(None, "is not a fedrec message (no metadata, or a repeated "
                                       "member)")
        got = sorted(n for n in names if n != "__meta__")
        if got != sorted(arrays):
            raise MessageRefused(None, f"has arrays {got}; expected {sorted(arrays)}")
        meta = _read_meta(zf)
        if meta.get("type") != type_name:
            raise MessageRefused(None, f"is a {meta.get('type')}; expected a {type_name}")
        cls = _message_class(type_name)
        if cls is None or not isinstance(meta.get("scalars"), dict):
            raise MessageRefused(None, f"has no readable scalars for {type_name}")
        out = {name: _read_array(zf, name, *want) for name, want in arrays.items()}
    return cls, meta["scalars"], out


def _read_meta(zf: zipfile.ZipFile) -> dict[str, Any]:
    meta = _read_array(zf, "__meta__", None, {"uint8"}, MAX_META_BYTES)
    try:
        out = json.loads(meta.tobytes().decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise MessageRefused(None, f"metadata is not JSON ({exc})") from None
    if not isinstance(out, dict):
        raise MessageRefused(None, "metadata is not a JSON object")
    return out


_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}


def _read_array(zf: zipfile.ZipFile, name: str, shape: list[int] | None, dtypes: set[str],
                max_bytes: int | None = None) -> np.ndarray:
    """One member, its header checked (``shape`` None: any 1-d array up to ``max_bytes``)
    before its data is inflated, and at most the bytes that header implies."""
    with zf.open(name + ".npy") as f:
        try:
            read = _HEADERS.get(np.lib.format.read_magic(f))
            if read is None:
                raise ValueError("unsupported .npy format version")
            header = read(f, max_header_size=10_000)
        except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile) as exc:
            raise MessageRefused(name, f"has no valid array header ({exc})") from None
        got_shape, fortran, dtype = header
        if str(dtype) not in dtypes or dtype.hasobject:
            raise MessageRefused(name, f"has dtype {dtype}; expected "
                                 f"{' or '.join(sorted(dtypes))}")
        size = math.prod(got_shape) * dtype.itemsize
        if (list(got_shape) != shape) if shape is not None else (
                len(got_shape) != 1 or size > max_bytes):
            raise MessageRefused(name, f"has shape {list(got_shape)}; expected "
                                 f"{shape if shape is not None else 'a small vector'}")
        try:
            raw = f.read(size + 1)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise MessageRefused(name, f"cannot be read ({exc})") from None
    if len(raw) != size:
        raise MessageRefused(name, f"holds {len(raw)} bytes; its header says {size}")
    arr = np.frombuffer(raw, dtype=dtype)
    return arr.reshape(got_shape, order="F" if fortran else "C")
