"""RDF terms written into SPARQL text, safely: the heart of forced bindings.

A forced binding pastes a value chosen at run time (a chat message, a sensor reading, an IRI out
of a notification) into SPARQL text. Whatever the value, the result must be exactly one RDF term
token, so nothing here trusts its input:

* IRIs are validated by pyoxigraph (RFC 3987) *and* against the SPARQL IRIREF character class
  before being written between `<` `>`; an invalid IRI is an error, never written.
* Literals are always written between double quotes with every `"`, `\\`, CR and LF escaped (and
  the other control characters as `\\uXXXX`), so a value cannot end the string early; lone
  surrogates (not encodable in UTF-8, hence not sendable) are refused. A value holding the text
  `\\u0022` is written `\\\\u0022`: Oxigraph (and Jena) do not take that for a code point escape,
  and even a parser that expanded `\\uXXXX` before tokenizing would only see an escaped `\\"`.
* Blank node labels are checked against BLANK_NODE_LABEL; language tags against LANGTAG and
  BCP 47 (pyoxigraph), and normalised to lower case as the store returns them.
* Python numbers, booleans and dates are typed (xsd:integer, xsd:double, xsd:decimal,
  xsd:boolean, xsd:dateTime...) and written in the canonical lexical form that Oxigraph stores
  and returns, so a value read back from the broker is *equal* to the value written (`1.0` is
  written `"1"^^xsd:double`, not `"1.0"`, because the store would answer `"1"`).

Every term is written in its full form (`"42"^^<http://www.w3.org/2001/XMLSchema#integer>`, never
a bare `42` or a prefixed name), so its meaning does not depend on the surrounding text.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyoxigraph import BlankNode, Literal, NamedNode

from broker.api import PN_CHARS, PN_CHARS_U

XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_STRING = XSD + "string"
RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"

# Prefixes every SEPA client knows without declaring them (the Java client adds these four to
# every JSAP): real JSAP files write `"datatype": "xsd:dateTime"` with no `xsd` namespace.
WELL_KNOWN_PREFIXES: Mapping[str, str] = {
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "rdfs": "http://www.w3.org/2000/01/rdf-schema#",
    "owl": "http://www.w3.org/2002/07/owl#",
    "xsd": XSD,
}

TERM_TYPES = ("uri", "literal", "bnode")

_IRI_FORBIDDEN = re.compile(r'[\x00-\x20<>"{}|^`\\]')  # outside the SPARQL IRIREF production
_LANGTAG = re.compile(r"[a-zA-Z]+(?:-[a-zA-Z0-9]+)*")
_SUPPLEMENTARY = "\U00010000-\U000effff"
_BNODE_LABEL = re.compile(
    f"[{PN_CHARS_U}{_SUPPLEMENTARY}0-9](?:[{PN_CHARS}{_SUPPLEMENTARY}.]*[{PN_CHARS}{_SUPPLEMENTARY}])?"
)
_PLX_ESCAPE = re.compile(r"\\([_~.\-!$&'()*+,;=/?#@%])")
_STRING_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
_ECHAR = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


class TermError(ValueError):
    """A value that cannot be written as the RDF term asked for; the caller adds the JSAP path."""


@dataclass(frozen=True)
class RdfTerm:
    """One validated RDF term and its SPARQL text. Build it with the functions of this module.

    `kind` is the JSAP / SPARQL JSON type (uri, literal, bnode); `datatype` is None for plain and
    language-tagged literals, so two equal terms have equal fields.
    """

    kind: str
    value: str
    datatype: str | None
    language: str | None
    text: str

    def to_pyoxigraph(self) -> NamedNode | BlankNode | Literal:
        """The same term as a pyoxigraph object (what a query on the store returns)."""
        if self.kind == "uri":
            return NamedNode(self.value)
        if self.kind == "bnode":
            return BlankNode(self.value)
        if self.language is not None:
            return Literal(self.value, language=self.language)
        if self.datatype is not None:
            return Literal(self.value, datatype=NamedNode(self.datatype))
        return Literal(self.value)


def expand_prefixed(value: str, prefixes: Mapping[str, str]) -> str:
    """`schema:Person` -> `http://schema.org/Person` when the prefix is known; otherwise unchanged.

    `http://...` is never taken for a prefixed name (its "local part" starts with `//`), and
    PN_LOCAL backslash escapes (`ex:a\\.b`) are undone as SPARQL would.
    """
    prefix, colon, local = value.partition(":")
    if colon and prefix in prefixes and not local.startswith("//"):
        return prefixes[prefix] + _PLX_ESCAPE.sub(r"\1", local)
    return value


def iri_term(iri: Any) -> RdfTerm:
    """An absolute IRI, validated, written `<...>`."""
    if not isinstance(iri, str):
        raise TermError(f"an IRI must be a string, got {type(iri).__name__}")
    bad = _IRI_FORBIDDEN.search(iri)
    if bad is not None:
        raise TermError(f"invalid IRI {iri!r}: character {bad.group()!r} is not allowed in an IRI")
    try:
        NamedNode(iri)
    except ValueError as error:  # includes UnicodeEncodeError for lone surrogates
        raise TermError(f"invalid IRI {iri!r}: {error}") from None
    return RdfTerm("uri", iri, None, None, f"<{iri}>")


def bnode_term(label: Any) -> RdfTerm:
    """A blank node `_:label` (the value may be given with or without its `_:`)."""
    if not isinstance(label, str):
        raise TermError(f"a blank node label must be a string, got {type(label).__name__}")
    bare = label[2:] if label.startswith("_:") else label
    if not _BNODE_LABEL.fullmatch(bare):
        raise TermError(f"invalid blank node label {label!r}")
    return RdfTerm("bnode", bare, None, None, f"_:{bare}")


def quote(lexical: str) -> str:
    """`lexical` as a SPARQL STRING_LITERAL2: one token whatever the characters inside."""
    try:
        lexical.encode("utf-8")
    except UnicodeEncodeError:
        raise TermError(f"{lexical!r} contains a lone surrogate, which no SPARQL text can carry") from None
    return '"' + _STRING_ESCAPE.sub(_escape_char, lexical) + '"'


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return _ECHAR.get(char) or f"\\u{ord(char):04X}"


def check_language(language: Any) -> str:
    """A language tag, validated (SPARQL LANGTAG and BCP 47) and lower-cased as the store keeps it."""
    if not isinstance(language, str):
        raise TermError(f"a language tag must be a string, got {type(language).__name__}")
    if not _LANGTAG.fullmatch(language):
        raise TermError(f"invalid language tag {language!r}")
    try:
        normalised = Literal("", language=language).language
    except ValueError as error:
        raise TermError(f"invalid language tag {language!r}: {error}") from None
    assert normalised is not None
    return normalised


def literal_term(lexical: str, datatype: str | None = None, language: str | None = None) -> RdfTerm:
    """A literal: plain, `"v"@lang` or `"v"^^<datatype>` (datatype an absolute IRI)."""
    if not isinstance(lexical, str):
        raise TermError(f"a literal's lexical form must be a string, got {type(lexical).__name__}")
    if datatype is not None:
        datatype = iri_term(datatype).value
    if language is not None:
        if datatype not in (None, RDF_LANG_STRING):
            raise TermError(f"a literal cannot have both a language tag and the datatype <{datatype}>")
        language = check_language(language)
        return RdfTerm("literal", lexical, None, language, f"{quote(lexical)}@{language}")
    if datatype == RDF_LANG_STRING:
        raise TermError("an rdf:langString literal needs a language tag")
    if datatype is None or datatype == XSD_STRING:
        return RdfTerm("literal", lexical, None, None, quote(lexical))
    return RdfTerm("literal", lexical, datatype, None, f"{quote(lexical)}^^<{datatype}>")


def _trim_fraction(text: str) -> str:
    """Drop trailing zeros of a fraction, and the point if nothing is left: `1.50` -> `1.5`."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def double_lexical(value: float) -> str:
    """Oxigraph's canonical xsd:double: shortest round-trip digits, positional, `NaN`/`INF`/`-INF`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return _trim_fraction(format(Decimal(repr(value)), "f"))


def decimal_lexical(value: Decimal) -> str:
    """Canonical xsd:decimal: positional, no trailing zeros, no negative zero."""
    if not value.is_finite():
        raise TermError(f"xsd:decimal has no {value}: use a float for NaN and infinities")
    text = _trim_fraction(format(value, "f"))
    return "0" if text == "-0" else text


def _timezone(offset: dt.timedelta | None) -> str:
    if offset is None:
        return ""
    if offset % dt.timedelta(minutes=1):
        raise TermError(f"XML Schema time zones are whole minutes, got an offset of {offset}")
    if abs(offset) > dt.timedelta(hours=14):
        raise TermError(f"XML Schema time zones are within ±14:00, got an offset of {offset}")
    if not offset:
        return "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


def _clock(value: dt.time | dt.datetime) -> str:
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text


def _date(value: dt.date) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def natural_lexical(value: Any) -> tuple[str, str]:
    """(canonical lexical form, XSD datatype) of a Python value that is not a string."""
    if isinstance(value, bool):  # before int: bool is an int
        return ("true" if value else "false"), XSD + "boolean"
    if isinstance(value, int):
        return str(value), XSD + "integer"
    if isinstance(value, float):
        return double_lexical(value), XSD + "double"
    if isinstance(value, Decimal):
        return decimal_lexical(value), XSD + "decimal"
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        return f"{_date(value)}T{_clock(value)}{_timezone(value.utcoffset())}", XSD + "dateTime"
    if isinstance(value, dt.date):
        return _date(value), XSD + "date"
    if isinstance(value, dt.time):
        return _clock(value) + _timezone(value.utcoffset()), XSD + "time"
    raise TermError(f"cannot write a {type(value).__name__} as an RDF literal")


def python_term(
    value: Any,
    kind: str,
    datatype: str | None = None,
    language: str | None = None,
    prefixes: Mapping[str, str] = WELL_KNOWN_PREFIXES,
) -> RdfTerm:
    """The term for a plain value given to a binding declared as `kind` (uri, literal or bnode).

    `datatype` (an absolute IRI) and `language` are the declaration's; they type a string value,
    and a non-string value keeps its own lexical form under a declared datatype.
    pyoxigraph terms are taken as they are (re-validated).
    """
    if isinstance(value, NamedNode):
        return iri_term(value.value)
    if isinstance(value, BlankNode):
        return bnode_term(value.value)
    if isinstance(value, Literal):
        natural = value.datatype.value if value.language is None else None
        return literal_term(value.value, natural, value.language)
    if kind == "uri":
        if not isinstance(value, str):
            raise TermError(f"a uri binding needs a string, got {type(value).__name__}")
        return iri_term(expand_prefixed(value, prefixes))
    if kind == "bnode":
        return bnode_term(value)
    if isinstance(value, str):
        return literal_term(value, datatype, language)
    if language is not None:
        raise TermError(f"a language tag applies only to a string, got {type(value).__name__}")
    lexical, natural = natural_lexical(value)
    return literal_term(lexical, datatype or natural)


def binding_term(
    value: Any,
    kind: str,
    datatype: str | None = None,
    language: str | None = None,
    prefixes: Mapping[str, str] = WELL_KNOWN_PREFIXES,
) -> RdfTerm:
    """The term for a value given to a forced binding declared (`kind`, `datatype`, `language`).

    Besides plain values (see :func:`python_term`), accepts a binding object as in a JSAP
    forcedBindings entry or a SPARQL JSON result (`{"type", "value", "datatype", "language" or
    "xml:lang"}`), so a term taken from a notification can be passed straight back. Its members
    win over the declaration; a literal object without datatype or language inherits the
    declared ones (as the Java SEPA client adds the declared datatype).
    """
    if not isinstance(value, Mapping):
        return python_term(value, kind, datatype, language, prefixes)
    raw_kind = value.get("type", kind)
    given_kind = raw_kind.lower() if isinstance(raw_kind, str) else raw_kind
    if given_kind == "typed-literal":
        given_kind = "literal"
    if given_kind not in TERM_TYPES:
        raise TermError(f"type: expected one of {', '.join(TERM_TYPES)}, got {raw_kind!r}")
    if value.get("value") is None:
        raise TermError("a binding object needs a value")
    given_datatype = value.get("datatype")
    given_language = value.get("language", value.get("xml:lang"))
    if given_kind == "literal" and given_datatype is None and given_language is None and kind == "literal":
        given_datatype, given_language = datatype, language
    elif given_datatype is not None:
        if not isinstance(given_datatype, str):
            raise TermError(f"datatype: expected a string, got {type(given_datatype).__name__}")
        given_datatype = expand_prefixed(given_datatype, {**WELL_KNOWN_PREFIXES, **prefixes})
    return python_term(value["value"], given_kind, given_datatype, given_language, prefixes)
