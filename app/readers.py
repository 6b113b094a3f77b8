"""Streaming readers of upload bodies: CSV and JSON rows out of a binary file, in bounded
memory. Pure: no HTTP, no SQL.

A reader decodes the body in chunks of :data:`CHUNK_BYTES` and yields one raw row at a
time, ``(line, user, item, rating, timestamp)`` with the values unvalidated, or a
:class:`app.ingest.RowError` for a row of the wrong structure. Problems that make the rest
of the body unreadable (not UTF-8, not JSON, the wrong JSON shape) raise
:class:`app.ingest.UploadRejected`; an unsupported media type raises
:class:`app.ingest.UnsupportedMediaType`. Nothing here holds more than one chunk plus one
row (or one JSON entry) of the body, whatever its size.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import json
from collections.abc import Iterator
from typing import BinaryIO

from app.ingest import RowError, UnsupportedMediaType, UploadRejected

CHUNK_BYTES = 1 << 20
CSV_HEADERS = (("user", "item", "rating"), ("user", "item", "rating", "timestamp"))
JSON_FIELDS = frozenset({"user", "item", "rating", "timestamp"})
SHAPE = 'JSON body must be an object {"ratings": [...]}'
RawRow = tuple[int, object, object, object, object]


def _decoded(stream: BinaryIO, what: str) -> Iterator[str]:
    """The body as UTF-8 text in chunks (a leading BOM dropped); invalid bytes raise
    :class:`UploadRejected` naming their offset in the body."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset = 0
    while True:
        data = stream.read(CHUNK_BYTES)
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            byte = offset - pending + exc.start
            raise UploadRejected([], f"{what} body is not valid UTF-8 (byte {byte})") from None
        offset += len(data)
        if text:
            yield text
        if not data:
            return


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    """Lines with their endings (``\\n``, ``\\r\\n`` or ``\\r``, as ``newline=""`` reads
    them), whatever the chunk boundaries."""
    carry = ""
    for text in chunks:
        lines = io.StringIO(carry + text, newline="").readlines()
        carry = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        yield from lines  # a final "\r" waits in carry: "\n" may start the next chunk
    if carry:
        yield carry


def _is_header(fields: list[str]) -> bool:
    """``user,item,rating[,timestamp]``, or any names whose third is a rating's
    (``userId,movieId,rating,timestamp`` as MovieLens' own CSV files, Book-Crossing's
    ``User-ID;ISBN;Book-Rating``); another first line is validated as data."""
    names = tuple(f.strip().lower() for f in fields)
    if names in CSV_HEADERS:
        return True
    third = "".join(c for c in names[2] if c.isalnum()) if len(names) >= 3 else ""
    return len(names) in (3, 4) and third.endswith("rating")


def _sniff(first: str) -> str:
    """The delimiter of a body without a declared one, from its first line: tab when it
    has tabs and no comma, semicolon when it has semicolons and neither, else comma."""
    if "\t" in first and "," not in first:
        return "\t"
    if ";" in first and "," not in first and "\t" not in first:
        return ";"
    return ","


def csv_rows(stream: BinaryIO, delimiter: str | None = None) -> Iterator[RawRow | RowError]:
    """The rows of a CSV body ``user,item,rating[,timestamp]`` (or TSV with ``delimiter``
    ``"\\t"``, e.g. MovieLens ``u.data`` as it is); ``line`` is the line number (an
    optional header line counts); blank lines are skipped. Without ``delimiter``, a first
    line with tabs and no comma makes the body TSV, one with semicolons and neither
    semicolon-separated (:func:`_sniff`)."""
    lines = _lines(_decoded(stream, "CSV" if delimiter != "\t" else "TSV"))
    first = next(lines, "")
    if delimiter is None:
        delimiter = _sniff(first)
    reader = csv.reader(itertools.chain([first] if first else [], lines),
                        delimiter=delimiter)
    number = 0
    while True:
        number += 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a field over the csv module's size limit
            raise UploadRejected([RowError(number, "row", f"unreadable CSV: {exc}")]) from None
        if not fields or (number == 1 and _is_header(fields)):
            continue
        if len(fields) not in (3, 4):
            yield RowError(number, "row", f"expected 3 or 4 fields, got {len(fields)}")
            continue
        stamp = fields[3] if len(fields) == 4 and fields[3] != "" else None
        yield number, fields[0], fields[1], fields[2], stamp


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


def json_rows(stream: BinaryIO) -> Iterator[RawRow | RowError]:
    """The entries of ``{"ratings": [...]}`` (other top-level keys are read and ignored);
    ``line`` is the 1-based position in ``ratings``."""
    text = _JsonText(_decoded(stream, "JSON"))
    first_char = text.peek()
    if first_char != "{":
        if first_char and first_char in "[\"-0123456789tfnNI":
            text.value()  # valid JSON of another shape is a shape error, not a syntax one
            raise UploadRejected([], SHAPE)
        raise text.invalid("Expecting value")
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


CSV_TYPES = ("text/csv", "application/csv")
TSV_TYPES = ("text/tab-separated-values", "text/tsv")
JSON_TYPES = ("application/json", "")
MULTIPART = "multipart/form-data"
FILE_FIELD = "file"
#: a multipart file part of one of these types, or none, is read by its filename's
#: extension, else by its first character ("{": JSON; else CSV or TSV)
GENERIC_TYPES = ("", "application/octet-stream", "text/plain")
EXTENSIONS = {".json": "application/json", ".csv": "text/csv",
              ".tsv": "text/tab-separated-values", ".tab": "text/tab-separated-values",
              ".data": "text/tab-separated-values"}


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def read_rows(stream: BinaryIO, content_type: str) -> Iterator[RawRow | RowError]:
    """The rows of a CSV, TSV or JSON body according to its media type (JSON when none)."""
    media = media_type(content_type)
    if media in CSV_TYPES:
        return csv_rows(stream)
    if media in TSV_TYPES:
        return csv_rows(stream, "\t")
    if media in JSON_TYPES:
        return json_rows(stream)
    raise UnsupportedMediaType(media)


def unwrap_multipart(stream: BinaryIO, content_type: str, out: BinaryIO) -> str:
    """Copy the file of a ``multipart/form-data`` body (``curl -F file=@u.data``: the part
    named ``file``, else the only part with a filename) into ``out`` chunk by chunk, and
    return the media type to read it as: the part's own, else by its filename's extension,
    else by its first character. Malformed bodies raise :class:`UploadRejected`."""
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise UploadRejected([], "multipart/form-data body without a boundary parameter")
    parts: list[dict] = []
    chosen: list[dict | None] = [None]
    header = {"field": b"", "value": b""}

    def begin() -> None:
        parts.append({"headers": {}, "size": 0})

    def field(data: bytes, start: int, end: int) -> None:
        header["field"] += data[start:end]

    def value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def header_end() -> None:
        parts[-1]["headers"][header["field"].decode("latin-1").lower()] = \
            header["value"].decode("latin-1")
        header["field"], header["value"] = b"", b""

    def headers_done() -> None:
        part = parts[-1]
        _, disposition = parse_options_header(part["headers"].get("content-disposition"))
        part["name"] = disposition.get(b"name", b"").decode("utf-8", "replace")
        part["filename"] = disposition.get(b"filename", b"").decode("utf-8", "replace")
        current = chosen[0]
        if part["name"] == FILE_FIELD or (part["filename"] and current is None):
            if current is None or current["name"] != FILE_FIELD:
                chosen[0] = part
                out.seek(0)
                out.truncate()

    def data(buf: bytes, start: int, end: int) -> None:
        if parts and parts[-1] is chosen[0]:
            out.write(buf[start:end])

    parser = MultipartParser(boundary, {
        "on_part_begin": begin, "on_header_field": field, "on_header_value": value,
        "on_header_end": header_end, "on_headers_finished": headers_done,
        "on_part_data": data})
    try:
        while chunk := stream.read(CHUNK_BYTES):
            parser.write(chunk)
        parser.finalize()
    except Exception as exc:  # noqa: BLE001 - any parser error is a malformed body
        raise UploadRejected([], f"malformed multipart/form-data body: {exc}") from None
    part = chosen[0]
    if part is None:
        raise UploadRejected([], f"multipart/form-data body has no file part; send the "
                                 f"ratings as -F {FILE_FIELD}=@ratings.csv")
    out.seek(0)
    media = media_type(part["headers"].get("content-type", ""))
    if media not in GENERIC_TYPES:
        return media
    extension = part["filename"][part["filename"].rfind("."):].lower() \
        if "." in part["filename"] else ""
    if extension in EXTENSIONS:
        return EXTENSIONS[extension]
    first = out.read(64).lstrip()
    out.seek(0)
    return "application/json" if first.startswith(b"{") else "text/csv"
