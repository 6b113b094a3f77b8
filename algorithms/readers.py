"""Upload bodies as rows: the one ratings reader (:mod:`algorithms.ratings_io`: gzip,
delimited text with its delimiter sniffed, JSON, Parquet) and the unwrapping of a
``multipart/form-data`` body's file. Pure: no HTTP, no SQL.

Problems that make the rest of the body unreadable raise
:class:`algorithms.ingest.UploadRejected`; an unsupported media type raises
:class:`algorithms.ingest.UnsupportedMediaType`. Nothing here holds more than one chunk plus one
row (or one JSON entry) of the body, whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from algorithms.ingest import RowError, UploadRejected
from algorithms.ratings_io import (  # noqa: F401 - the reader's names, as the API uses them
    CHUNK_BYTES,
    CSV_TYPES,
    JSON_TYPES,
    PARQUET_TYPES,
    TSV_TYPES,
    RawRow,
    media_type,
    read_rows,
    text_rows,
)


def csv_rows(stream: BinaryIO, delimiter: str | None = None) -> Iterator[RawRow | RowError]:
    """The rows of an uncompressed delimited-text body (the delimiter sniffed when None)."""
    from algorithms import ratings_io

    return text_rows(ratings_io._chunks(stream), "" if delimiter is None else delimiter)


def json_rows(stream: BinaryIO) -> Iterator[RawRow | RowError]:
    """The rows of an uncompressed JSON body ``{"ratings": [...]}``."""
    from algorithms import ratings_io

    return ratings_io.json_rows(ratings_io._chunks(stream))


MULTIPART = "multipart/form-data"
FILE_FIELD = "file"
#: a multipart file part of one of these types, or none, is read by its filename's
#: extension (``.gz`` dropped), else by its first character ("{": JSON; else delimited
#: text; gzip and Parquet are recognised by their magic bytes whatever the type)
GENERIC_TYPES = ("", "application/octet-stream", "text/plain", "application/gzip",
                 "application/x-gzip")
EXTENSIONS = {".json": "application/json", ".csv": "text/csv",
              ".tsv": "text/tab-separated-values", ".tab": "text/tab-separated-values",
              ".data": "text/tab-separated-values", ".dat": "text/csv",
              ".parquet": PARQUET_TYPES[0]}


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
    name = part["filename"].lower().removesuffix(".gz")
    extension = name[name.rfind("."):] if "." in name else ""
    if extension in EXTENSIONS:
        return EXTENSIONS[extension]
    first = out.read(64).lstrip()
    out.seek(0)
    return "application/json" if first.startswith(b"{") else "text/csv"
