"""The provenance header every exported file carries, so ``--check`` can regenerate it.

One line, the same in every format, each in the format's own comment syntax::

    fsm-diagram ref=fsm.lifecycles:JobLifecycle format=mermaid
    fsm-diagram ref=fsm.lifecycles:JobLifecycle format=svg dot-sha256=3f1c...

- Mermaid: ``%% <line>`` right after ``stateDiagram-v2``; DOT: ``// <line>`` on line 1;
- SVG: ``<!-- <line> -->`` before the ``<svg`` element;
- PNG: a ``tEXt`` chunk with keyword ``fsm-diagram`` right after ``IHDR``.

Every value is percent-encoded (:func:`encode`): besides spaces and line breaks, ``-`` is
encoded too (``%2D``), so no value can put ``--`` inside the SVG's XML comment (which XML
forbids) or end it early.  A header written before ``-`` was encoded still reads the same.

A rendered image (SVG, PNG) records the SHA-256 of the DOT text it was rendered from:
Graphviz versions lay out and serialise the same graph differently, so ``--check`` compares
that digest with a fresh export's DOT text instead of re-rendering and comparing images
(which would flap between Graphviz versions and would need Graphviz to check).  An export
of one stored entity also names it (``entity=...``); ``--check`` refuses those, they are
snapshots of data, not of a lifecycle.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

MARK = "fsm-diagram"
_SAFE = "_.:~"
"""Kept as they are in a header value; everything else (``-`` included) is percent-encoded."""
_LINE = re.compile(r"fsm-diagram((?: [a-z0-9-]+=\S+)+)")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True, slots=True)
class Header:
    """Where an exported file came from."""

    ref: str
    format: str
    dot_sha256: str | None = None
    entity: str | None = None

    @property
    def line(self) -> str:
        parts = [MARK, f"ref={encode(self.ref)}", f"format={encode(self.format)}"]
        if self.dot_sha256 is not None:
            parts.append(f"dot-sha256={encode(self.dot_sha256)}")
        if self.entity is not None:
            parts.append(f"entity={encode(self.entity, safe='')}")
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> Header | None:
        """The header in ``text`` (the first ``fsm-diagram ...`` line), or ``None``."""
        match = _LINE.search(text)
        if match is None:
            return None
        fields = dict(item.split("=", 1) for item in match.group(1).split())
        if "ref" not in fields or "format" not in fields:
            return None
        entity, digest = fields.get("entity"), fields.get("dot-sha256")
        return cls(
            ref=unquote(fields["ref"], errors="surrogatepass"),
            format=unquote(fields["format"]),
            dot_sha256=unquote(digest) if digest is not None else None,
            entity=unquote(entity, errors="surrogatepass") if entity is not None else None,
        )


def encode(value: str, safe: str = _SAFE) -> str:
    """``value`` percent-encoded for a header: ASCII letters, digits and ``safe`` stay, the
    rest (``-``, spaces, ``%``, control and non-ASCII characters) becomes ``%XX`` (UTF-8).

    ``urllib.parse.quote`` never encodes ``-``, so it is encoded here: two of them in a row
    would end an XML comment early, and ``--`` is not allowed inside one.
    """
    return quote(value, safe=safe, errors="surrogatepass").replace("-", "%2D")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- SVG ----------------------------------------------------------------------------------


def stamp_svg(svg: bytes, header: Header) -> bytes:
    """``svg`` with the header as an XML comment just before the ``<svg`` element."""
    at = svg.find(b"<svg")
    if at < 0:
        raise ValueError("not an SVG document: no <svg element")
    comment = f"<!-- {header.line} -->\n".encode()
    return svg[:at] + comment + svg[at:]


def read_svg(data: bytes) -> Header | None:
    at = data.find(b"<svg")
    head = data[: at if at >= 0 else 4096]
    return Header.parse(head.decode("utf-8", errors="replace"))


# -- PNG ----------------------------------------------------------------------------------


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def stamp_png(png: bytes, header: Header) -> bytes:
    """``png`` with a ``tEXt`` chunk (keyword ``fsm-diagram``) inserted after ``IHDR``."""
    if not png.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG image: bad signature")
    (ihdr_len,) = struct.unpack(">I", png[8:12])
    end = 8 + 12 + ihdr_len
    text = _chunk(b"tEXt", MARK.encode("latin-1") + b"\x00" + header.line.encode("latin-1", errors="replace"))
    return png[:end] + text + png[end:]


def read_png(data: bytes) -> Header | None:
    if not data.startswith(_PNG_SIGNATURE):
        return None
    pos = 8
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        payload = data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt":
            keyword, _, value = payload.partition(b"\x00")
            if keyword == MARK.encode("latin-1"):
                return Header.parse(MARK + " " + value.decode("latin-1").removeprefix(MARK).strip())
        if kind == b"IEND":
            break
        pos += 12 + length
    return None


def read_header(data: bytes) -> Header | None:
    """The provenance header of an exported file's bytes, whatever its format."""
    if data.startswith(_PNG_SIGNATURE):
        return read_png(data)
    if b"<svg" in data[:65536]:
        return read_svg(data)
    return Header.parse(data[:4096].decode("utf-8", errors="replace"))


__all__ = ["MARK", "Header", "encode", "read_header", "read_png", "read_svg", "sha256_text", "stamp_png", "stamp_svg"]
