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
import pkgutil
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
        cls = _REGISTRY.get(meta["type"])
        module = str(meta["type"]).rpartition(".")[0]
        if cls is None and module.startswith("algorithms.") and module in _ALGORITHM_MODULES:
            importlib.import_module(module)  # a process that has not run this algorithm yet
            cls = _REGISTRY.get(meta["type"])
        if cls is None:
            raise ValueError(f"unknown message type {meta['type']!r}")
        return cls(**arrays, **meta["scalars"])


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
