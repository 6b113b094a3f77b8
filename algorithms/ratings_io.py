"""The one reader of ratings: files given to ``fedrec simulate`` and the tenant agent, and
bodies uploaded to the API (the Python client sends a file's bytes unchanged).

Rows ``user, item, rating[, timestamp]`` come out one at a time, as
``(line, user, item, rating, timestamp)`` with the values unvalidated, or a
:class:`RowError` for a row of the wrong structure, in bounded memory whatever the size:

* compression: gzip, recognised by its magic bytes (or declared by an HTTP
  ``Content-Encoding: gzip``), decompressed as a stream of chunks of at most
  :data:`CHUNK_BYTES` with a cap on the decompressed size (:class:`BodyTooLarge`);
* delimited text (UTF-8): the delimiter is found on the first line (``::`` as MovieLens
  1M, tab as ``u.data``, ``;``, ``,`` or runs of spaces), a header line is recognised by its
  names, a decimal comma (``3,5``) is read as a point when the delimiter is not a comma;
* JSON ``{"ratings": [{"user", "item", "rating", "timestamp"?}, ...]}``;
* Parquet (recognised by its magic bytes or media type), through pyarrow, an optional
  dependency (``pip install 'fedrec[parquet]'``).

Problems that make the rest unreadable raise :class:`UploadRejected`, each naming the
line or byte and, where it can tell, the format the data looks like. Pure: no HTTP, no
SQL; the service maps the exceptions to status codes.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import itertools
import json
import re
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

CHUNK_BYTES = 1 << 20
MAX_LINE_CHARS = 1 << 20
"""A text line longer than this is refused (a ratings line is a few dozen characters; the
cap bounds the memory of a body without line breaks, e.g. a decompressed bomb)."""
CSV_HEADERS = (("user", "item", "rating"), ("user", "item", "rating", "timestamp"))
JSON_FIELDS = frozenset({"user", "item", "rating", "timestamp"})
SHAPE = 'JSON body must be an object {"ratings": [...]}'
GZIP_MAGIC, PARQUET_MAGIC, ZIP_MAGIC = b"\x1f\x8b", b"PAR1", b"PK\x03\x04"
DELIMITERS = ("::", "\t", ";", ",", None)
"""Tried on the first line in this order; None: runs of spaces."""
PARQUET_EXTRA = "pip install 'fedrec[parquet]'"
RawRow = tuple[int, object, object, object, object]


@dataclasses.dataclass(frozen=True)
class RowError:
    """One offending row of an upload."""

    line: int
    field: str
    reason: str


class UploadRejected(Exception):
    """The upload is invalid; nothing may be stored."""

    def __init__(self, errors: list[RowError], message: str | None = None,
                 total: int | None = None):
        self.errors = sorted(errors, key=lambda e: e.line)
        self.total = len(errors) if total is None else total
        """How many errors there were; ``errors`` may list only the first of them."""
        super().__init__(message or f"{self.total} invalid row(s); nothing was stored")


class UnsupportedMediaType(Exception):
    """The upload is not JSON, CSV, TSV, Parquet or multipart (or Parquet without pyarrow)."""

    def __init__(self, media: str, message: str | None = None):
        self.media = media
        super().__init__(message or (
            f"unsupported Content-Type {media!r}; use application/json, text/csv, "
            "text/tab-separated-values, application/vnd.apache.parquet or "
            "multipart/form-data"))


class BodyTooLarge(Exception):
    """The decompressed body (or a Parquet file's uncompressed data) exceeds the cap."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"the decompressed upload exceeds {limit} bytes "
                         "(FEDREC_MAX_DECOMPRESSED_BYTES); nothing was stored")


# -- bytes: chunks, gzip, the look of a body ------------------------------------------------

def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while data := stream.read(CHUNK_BYTES):
        yield data


def _capped(chunks: Iterable[bytes], limit: int | None) -> Iterator[bytes]:
    total = 0
    for data in chunks:
        total += len(data)
        if limit is not None and total > limit:
            raise BodyTooLarge(limit)
        yield data


def gunzip(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The decompressed bytes of gzip data (several members are concatenated, as ``gzip``
    writes them), each output chunk at most :data:`CHUNK_BYTES`: memory stays bounded
    however well the data compresses."""
    inflater, fed = zlib.decompressobj(wbits=31), False
    try:
        for data in chunks:
            while data:
                fed = True
                yield inflater.decompress(data, CHUNK_BYTES)
                data = inflater.unconsumed_tail
                if inflater.eof:  # another member may follow
                    data = inflater.unused_data + data
                    inflater, fed = zlib.decompressobj(wbits=31), False
    except zlib.error as exc:
        raise UploadRejected([], f"the body is not valid gzip data: {exc}") from None
    if fed and not inflater.eof:
        raise UploadRejected([], "the gzip data is truncated (the file was cut short)")


def _peeked(chunks: Iterator[bytes], size: int = 4) -> tuple[bytes, Iterator[bytes]]:
    """The first ``size`` bytes (fewer at the end) and the same chunks, unconsumed."""
    head = b""
    taken = []
    for data in chunks:
        taken.append(data)
        head += data
        if len(head) >= size:
            break
    return head[:size], itertools.chain(taken, chunks)


def looks_like(head: bytes) -> str | None:
    """What a body that is not UTF-8 text looks like, from its first bytes, in words."""
    if head.startswith(ZIP_MAGIC):
        return ("a ZIP archive (or an .xlsx spreadsheet): unzip it, or export the sheet "
                "as CSV")
    if head.startswith(b"\xff\xfe") or head.startswith(b"\xfe\xff"):
        return "UTF-16 text: save it as UTF-8"
    return None


def _decoded(chunks: Iterable[bytes], what: str) -> Iterator[str]:
    """The body as UTF-8 text in chunks (a leading BOM dropped); invalid bytes raise
    :class:`UploadRejected` naming their offset and, when it can tell, what the body
    looks like."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset, head = 0, b""
    for data in itertools.chain(chunks, [b""]):
        head = head or data[:8]
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            byte = offset - pending + exc.start
            hint = looks_like(head) or ("Latin-1 or Windows-1252 text, perhaps: save it "
                                        "as UTF-8")
            raise UploadRejected([], f"{what} body is not valid UTF-8 (byte {byte}); it "
                                     f"looks like {hint}") from None
        offset += len(data)
        if text:
            yield text


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    """Lines with their endings (``\\n``, ``\\r\\n`` or ``\\r``, as ``newline=""`` reads
    them), whatever the chunk boundaries; a line over :data:`MAX_LINE_CHARS` is refused."""
    carry, number = "", 0
    for text in chunks:
        lines = io.StringIO(carry + text, newline="").readlines()
        carry = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        if len(carry) > MAX_LINE_CHARS:
            raise UploadRejected([RowError(number + len(lines) + 1, "row",
                                           f"longer than {MAX_LINE_CHARS} characters")])
        number += len(lines)
        yield from lines  # a final "\r" waits in carry: "\n" may start the next chunk
    if carry:
        yield carry


# -- delimited text -----------------------------------------------------------------------

def _split(line: str, delimiter: str | None) -> list[str]:
    """A line's fields (quotes are honoured by the csv module for one-character
    delimiters)."""
    line = line.rstrip("\r\n")
    if delimiter is None:
        return line.split()
    if delimiter == "::":
        return line.split("::")
    try:
        return next(csv.reader([line], delimiter=delimiter), [])
    except csv.Error:  # a quoted field running past the line's end
        return [line]


def sniff(first: str) -> str | None:
    """The delimiter of a body without a declared one, from its first line: the first of
    :data:`DELIMITERS` that splits it into 3 or 4 fields, else the first that splits it
    into 3 or more, else a comma."""
    counts = [(d, len(_split(first, d))) for d in DELIMITERS]
    for d, n in counts:
        if n in (3, 4):
            return d
    return next((d for d, n in counts if n >= 3), ",")


def describe_delimiter(delimiter: str | None) -> str:
    return {None: "space", "\t": "tab", "::": "'::'"}.get(delimiter, repr(delimiter)) + \
        "-separated"


def _is_header(fields: list[str]) -> bool:
    """``user,item,rating[,timestamp]``, or any names whose third is a rating's
    (``userId,movieId,rating,timestamp`` as MovieLens' own CSV files, Book-Crossing's
    ``User-ID;ISBN;Book-Rating``); another first line is validated as data."""
    names = tuple(f.strip().lower() for f in fields)
    if names in CSV_HEADERS:
        return True
    third = "".join(c for c in names[2] if c.isalnum()) if len(names) >= 3 else ""
    return len(names) in (3, 4) and third.endswith("rating")


_DECIMAL_COMMA = re.compile(r"\s*[+-]?\d*,\d+\s*")


def _field_count_error(number: int, line: str, fields: list[str], delimiter: str | None,
                       extra_columns: bool) -> RowError:
    """The error of a line of the wrong width, with the delimiter it seems to use."""
    want = "3 or more" if extra_columns else "3 or 4"
    reason = (f"expected {want} fields, got {len(fields)} (user, item, rating[, timestamp], "
              f"{describe_delimiter(delimiter)} as the first line)")
    other = sniff(line)
    if other != delimiter and len(_split(line, other)) >= 3:
        reason += f"; this line looks {describe_delimiter(other)}"
    return RowError(number, "row", reason)


def text_rows(chunks: Iterable[bytes], delimiter: str | None = "",
              extra_columns: bool = False, what: str = "CSV") -> Iterator[RawRow | RowError]:
    """The rows of delimited text ``user,item,rating[,timestamp]``; ``line`` is the line
    number (a header line counts); blank lines are skipped. ``delimiter`` "" finds it on
    the first line (:func:`sniff`), which is read at once (an unreadable one raises here).
    With ``extra_columns`` fields after the fourth are ignored, else a row must have 3 or
    4 fields."""
    lines = _lines(_decoded(chunks, what))
    first = next(lines, "")
    if delimiter == "":
        delimiter = sniff(first.rstrip("\r\n"))
    decimal_comma = delimiter != ","
    body = itertools.chain([first] if first else [], lines)
    if delimiter is None or delimiter == "::":
        reader = (_split(line, delimiter) for line in body)
    else:
        reader = csv.reader(body, delimiter=delimiter)
    return _rows(reader, delimiter, decimal_comma, extra_columns)


def _rows(reader: Iterator[list[str]], delimiter: str | None, decimal_comma: bool,
          extra_columns: bool) -> Iterator[RawRow | RowError]:
    number = 0
    while True:
        number += 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a field over the csv module's size limit
            raise UploadRejected([RowError(number, "row", f"unreadable CSV: {exc}")]) from None
        width = len(fields)
        if number == 1 and _is_header(fields):
            continue
        if width == 3 or width == 4 or (width > 4 and extra_columns):
            rating = fields[2]
            if decimal_comma and "," in rating and _DECIMAL_COMMA.fullmatch(rating):
                rating = rating.replace(",", ".")
            yield number, fields[0], fields[1], rating, fields[3] or None if width > 3 else None
        elif width and (width > 1 or fields[0].strip()):  # not a blank line
            line = delimiter.join(fields) if delimiter else " ".join(fields)
            yield _field_count_error(number, line, fields, delimiter, extra_columns)


# -- JSON -----------------------------------------------------------------------------------

class _JsonText:
    """A window on a JSON text read chunk by chunk; values are decoded one at a time."""

    decoder = json.JSONDecoder()

    def __init__(self, chunks: Iterator[str]):
        self.chunks, self.buf, self.pos, self.base, self.eof = chunks, "", 0, 0, False

    def _more(self) -> bool:
        """Append the next chunk (dropping what was consumed); False at the end."""
        if self.eof:
            return False
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            return False
        self.base += self.pos
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return True

    def _cut(self, pos: int, message: str = "") -> bool:
        """Whether a value ending or failing at ``pos`` may have been cut by the window's
        end (the longest partial token, "-Infinit", is 8 characters); a syntax error well
        inside the window is final without reading the rest of the body."""
        return pos >= len(self.buf) - 16 or message.startswith("Unterminated string")

    def invalid(self, message: str) -> UploadRejected:
        return UploadRejected([], f"body is not valid JSON: {message} "
                                  f"(char {self.base + self.pos})")

    def peek(self) -> str:
        """The next non-blank character without consuming it ("" at the end)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\n\r":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def take(self, expected: str) -> str:
        """Consume the next non-blank character, which must be one of ``expected``."""
        char = self.peek()
        if not char or char not in expected:
            raise self.invalid(f"Expecting {' or '.join(map(repr, expected))}")
        self.pos += 1
        return char

    def value(self) -> object:
        """Decode the next value; a value cut by the window's end waits for more text."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._cut(exc.pos, exc.msg) and self._more():
                    continue
                raise self.invalid(exc.msg) from None
            except ValueError as exc:  # an integer of more than 4300 digits
                raise UploadRejected([], f"body is not valid JSON: {str(exc)[:200]}") from None
            except RecursionError:
                raise UploadRejected([], "body is not valid JSON: nested too deeply") from None
            if self._cut(end) and self._more():
                continue  # "1." or "1e" may be the start of a number in the next chunk
            self.pos = end
            return value


def json_rows(chunks: Iterable[bytes]) -> Iterator[RawRow | RowError]:
    """The entries of ``{"ratings": [...]}`` (other top-level keys are read and ignored);
    ``line`` is the 1-based position in ``ratings``."""
    text = _JsonText(_decoded(chunks, "JSON"))
    first_char = text.peek()
    if first_char != "{":
        if first_char and first_char in "[\"-0123456789tfnNI":
            text.value()  # valid JSON of another shape is a shape error, not a syntax one
            raise UploadRejected([], SHAPE)
        hint = ("; it looks like delimited text: send it as text/csv" if first_char else "")
        raise UploadRejected([], f"body is not valid JSON: Expecting value (char "
                                 f"{text.base + text.pos}){hint}")
    text.take("{")
    has_ratings, first = False, True
    while text.peek() != "}":
        if not first:
            text.take(",")
        first = False
        key = text.value()
        if not isinstance(key, str):
            raise text.invalid("Expecting property name")
        text.take(":")
        if key != "ratings":
            text.value()
            continue
        if has_ratings:
            raise UploadRejected([], 'JSON body has "ratings" twice')
        if text.peek() != "[":
            text.value()
            raise UploadRejected([], SHAPE)
        has_ratings = True
        yield from _json_entries(text)
    text.take("}")
    if not has_ratings:
        raise UploadRejected([], SHAPE)
    if text.peek():
        raise text.invalid("Extra data")


def _json_entries(text: _JsonText) -> Iterator[RawRow | RowError]:
    text.take("[")
    number = 0
    while text.peek() != "]":
        if number:
            text.take(",")
        number += 1
        row = text.value()
        if not isinstance(row, dict):
            yield RowError(number, "row", "must be an object")
            continue
        unknown = set(row) - JSON_FIELDS
        if unknown:
            names = ", ".join(sorted(map(str, unknown)))
            yield RowError(number, "row", f"unknown field(s): {names}")
            continue
        yield number, row.get("user"), row.get("item"), row.get("rating"), row.get("timestamp")
    text.take("]")


# -- Parquet --------------------------------------------------------------------------------

PARQUET_TYPES = ("application/vnd.apache.parquet", "application/x-parquet",
                 "application/parquet")


def _parquet_columns(names: list[str]) -> list[str]:
    """``user, item, rating[, timestamp]`` by name (any case), else the 3 or 4 columns."""
    lower = {n.lower(): n for n in names}
    if {"user", "item", "rating"} <= set(lower):
        return [lower[n] for n in ("user", "item", "rating", "timestamp") if n in lower]
    if len(names) in (3, 4):
        return list(names)
    raise UploadRejected([], f"the Parquet file's columns are {names}: name them user, "
                             "item, rating[, timestamp], or keep only those 3 or 4")


def _plain(value: object) -> object:
    """A Parquet cell as an upload's value (times as ISO 8601, small ints as keys)."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def parquet_rows(file: BinaryIO, max_bytes: int | None = None
                 ) -> Iterator[RawRow | RowError]:
    """The rows of a Parquet file (``line``: the 1-based row number), read 512 rows at a
    time; refused with :class:`BodyTooLarge` when its uncompressed data exceeds
    ``max_bytes``."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UnsupportedMediaType(PARQUET_TYPES[0], "Parquet uploads need pyarrow on the "
                                   f"server: {PARQUET_EXTRA}") from None
    try:
        parquet = pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure is an unreadable file
        raise UploadRejected([], f"the body is not a readable Parquet file: {exc}") from None
    meta = parquet.metadata
    size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    if max_bytes is not None and size > max_bytes:
        raise BodyTooLarge(max_bytes)
    columns = _parquet_columns(parquet.schema_arrow.names)
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=512, columns=columns):
            values = [batch.column(i).to_pylist() for i in range(len(columns))]
            for row in zip(*values, strict=True):
                number += 1
                yield (number, *map(_plain, row[:3]),
                       _plain(row[3]) if len(row) == 4 else None)
    except UploadRejected:
        raise
    except Exception as exc:  # noqa: BLE001
        raise UploadRejected([], f"the Parquet file is unreadable at row {number + 1}: "
                                 f"{exc}") from None


# -- any body -------------------------------------------------------------------------------

CSV_TYPES = ("text/csv", "application/csv")
TSV_TYPES = ("text/tab-separated-values", "text/tsv")
JSON_TYPES = ("application/json", "")


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def read_rows(stream: BinaryIO, content_type: str, content_encoding: str | None = None,
              max_bytes: int | None = None, extra_columns: bool = False
              ) -> Iterator[RawRow | RowError]:
    """The rows of a body by its media type (JSON when none), after gzip (declared by
    ``content_encoding`` or recognised by its magic bytes) is undone; a body starting with
    Parquet's magic is Parquet whatever its declared type. ``max_bytes`` caps the
    decompressed size (:class:`BodyTooLarge`)."""
    media = media_type(content_type)
    if media not in CSV_TYPES + TSV_TYPES + JSON_TYPES + PARQUET_TYPES:
        raise UnsupportedMediaType(media)
    start = stream.tell() if stream.seekable() else 0
    chunks: Iterator[bytes] = _chunks(stream)
    encoding = (content_encoding or "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise UnsupportedMediaType(media, f"unsupported Content-Encoding {encoding!r}; "
                                          "send the body as it is or gzip-compressed")
    head, chunks = _peeked(chunks)
    if encoding in ("gzip", "x-gzip") and not head.startswith(GZIP_MAGIC):
        raise UploadRejected([], "Content-Encoding is gzip but the body is not gzip data")
    layers = 0
    while head.startswith(GZIP_MAGIC) and layers < 2:  # a .gz sent with Content-Encoding
        head, chunks = _peeked(_capped(gunzip(chunks), max_bytes))
        layers += 1
    if head.startswith(PARQUET_MAGIC) or media in PARQUET_TYPES:
        if not layers and stream.seekable():
            stream.seek(start)
            return parquet_rows(stream, max_bytes)
        return _spooled_parquet(chunks, max_bytes)
    if media in JSON_TYPES:
        return json_rows(chunks)
    delimiter = "\t" if media in TSV_TYPES else ""
    return text_rows(chunks, delimiter, extra_columns, "TSV" if delimiter else "CSV")


def _spooled_parquet(chunks: Iterator[bytes], max_bytes: int | None
                     ) -> Iterator[RawRow | RowError]:
    """Parquet needs random access: the (decompressed) bytes spooled to a temporary file."""
    with tempfile.SpooledTemporaryFile(max_size=CHUNK_BYTES) as spool:
        for data in chunks:
            spool.write(data)
        spool.seek(0)
        yield from parquet_rows(spool, max_bytes)
