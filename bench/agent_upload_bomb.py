"""Time and Python allocations of refusing a compressed agent upload (a zip bomb).

Run from the repository root::

    python -m bench.agent_upload_bomb

The body is a deflated message archive of about 260 kB whose first array inflates to
256 MiB. ``Message.from_bytes`` (what the coordinator parsed uploads with before the schema
was checked from the archive's headers) inflates it whole before anything can refuse it;
``read_expected`` refuses it from the member's header.
"""

from __future__ import annotations

import io
import json
import time
import tracemalloc
import zipfile

import numpy as np

from algorithms.messages import Message, read_expected


def npy(shape, descr="<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue()


def deflated(members: dict[str, tuple[bytes, int]]) -> bytes:
    """A zip (deflate) of ``name.npy`` members: given bytes, then that many zero bytes,
    written in chunks (the test itself never holds the inflated size)."""
    buf, chunk = io.BytesIO(), bytes(1 << 20)
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (head, zeros) in members.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                f.write(head)
                for _ in range(zeros >> 20):
                    f.write(chunk)
    return buf.getvalue()


def meta_member(type_name: str) -> tuple[bytes, int]:
    text = json.dumps({"type": type_name, "scalars": {}}).encode()
    return npy((len(text),), "|u1") + text, 0


KIND = "algorithms.fedmc_admm.Upload"
INFLATED = 256 << 20
EXPECTED = {"W": ([5, 30], {"float64"}), "Y": ([5, 30], {"float64"})}


def measure(call) -> tuple[float, float, str]:
    """(milliseconds, peak MiB of Python allocations, exception raised)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        call()
        outcome = "accepted"
    except Exception as exc:  # noqa: BLE001 - the refusal is the measured outcome
        outcome = type(exc).__name__
    ms = (time.perf_counter() - start) * 1000
    peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    return ms, peak, outcome


def main() -> None:
    body = deflated({"__meta__": meta_member(KIND), "W": (npy((INFLATED // 8,)), INFLATED),
                     "Y": (npy((5, 30)), 0)})
    print(f"body: {len(body)} bytes, inflating to {INFLATED >> 20} MiB")
    for name, call in [("Message.from_bytes", lambda: Message.from_bytes(body)),
                       ("read_expected", lambda: read_expected(body, KIND, EXPECTED))]:
        ms, peak, outcome = measure(call)
        print(f"{name}: {ms:.0f} ms, peak {peak:.1f} MiB, {outcome}")


if __name__ == "__main__":
    main()
