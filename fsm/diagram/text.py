"""Free text (guard descriptions, reasons, entity ids, stored history) made safe to draw.

Graphviz writes labels into SVG (XML) as they are, and an XML parser refuses a document
holding a character XML does not allow: the C0 controls but tab, line feed and carriage
return (NUL included, which also ends a DOT string early), lone surrogates, U+FFFE and
U+FFFF.  Each such character is drawn as U+FFFD (the replacement character) instead, in
every format, so the text of a label is the same in Mermaid, DOT, SVG and PNG.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_chars(value: str) -> str:
    """``value`` with every character XML 1.0 does not allow replaced by U+FFFD."""
    return _NOT_XML.sub(REPLACEMENT, value)


__all__ = ["REPLACEMENT", "xml_chars"]
