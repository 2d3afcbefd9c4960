"""A fast SPARQL 1.1 tokenizer: one compiled regular expression, run in C by `re`.

The update path never parses SPARQL fully in Python (it would cost more than the whole update
budget): it tokenizes, recognises the structure of the request, and hands the pieces to
pyoxigraph's Rust parsers. Tokens keep their offsets so errors can name line and column and
pieces of the original text can be passed on verbatim.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from broker.errors import SparqlSyntaxError

PN_CHARS_BASE = (
    "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd"
)
PN_CHARS_U = PN_CHARS_BASE + "_"
PN_CHARS = PN_CHARS_U + "\\-0-9\u00b7\u0300-\u036f\u203f-\u2040"
_PLX = r"%[0-9A-Fa-f]{2}|\\[_~.\-!$&'()*+,;=/?#@%]"
PN_PREFIX = f"[{PN_CHARS_BASE}](?:[{PN_CHARS}.]*[{PN_CHARS}])?"
PN_LOCAL = f"(?:[{PN_CHARS_U}:0-9]|{_PLX})(?:(?:[{PN_CHARS}.:]|{_PLX})*(?:[{PN_CHARS}:]|{_PLX}))?"
_ECHAR = r"\\[tbnrf\"'\\]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}"

# Lexical pieces shared with :mod:`broker.sparql.fast_blocks`, which must cut text exactly where
# this tokenizer would.
IRI_PATTERN = r"<[^<>\"{}|^`\\\x00-\x20]*>"
STRING_PATTERN = (
    rf"'''(?:(?:'|'')?(?:[^'\\]|{_ECHAR}))*'''"
    rf'|"""(?:(?:"|"")?(?:[^"\\]|{_ECHAR}))*"""'
    rf"|'(?:[^'\\\n\r]|{_ECHAR})*'"
    rf'|"(?:[^"\\\n\r]|{_ECHAR})*"'
)
PNAME_PATTERN = rf"(?:{PN_PREFIX})?:(?:{PN_LOCAL})?"
BNODE_PATTERN = rf"_:[{PN_CHARS_U}0-9](?:[{PN_CHARS}.]*[{PN_CHARS}])?"
VAR_PATTERN = rf"[?$][{PN_CHARS_U}0-9][{PN_CHARS_U}0-9\u00b7\u0300-\u036f\u203f-\u2040]*"
PN_ESCAPE = r"\\[_~.\-!$&'()*+,;=/?#@%]"
# Characters of names, numbers and the punctuation a quad block may hold, minus the ones the
# fast block scanner must look at itself: "_" (":_" starts a blank node), "-" ("--" is RDF 1.2).
BLOCK_CHARS = PN_CHARS_BASE + "0-9\u00b7\u0300-\u036f\u203f-\u2040" + r"\s:.;,^@%+\])"

# (kind, pattern) in the order they are tried: the first that matches at a position wins.
TOKEN_PARTS: tuple[tuple[str, str], ...] = (
    ("WS", r"\s+"),
    ("COMMENT", r"#[^\r\n]*"),
    ("IRI", IRI_PATTERN),
    ("STRING", STRING_PATTERN),
    ("PNAME", PNAME_PATTERN),
    ("BNODE", BNODE_PATTERN),
    ("VAR", VAR_PATTERN),
    ("LANG", r"@[a-zA-Z]+(?:-[a-zA-Z0-9]+)*"),
    (
        "NUMBER",
        r"[0-9]+\.[0-9]*[eE][+-]?[0-9]+|\.[0-9]+[eE][+-]?[0-9]+|[0-9]+[eE][+-]?[0-9]+|[0-9]*\.[0-9]+|[0-9]+",
    ),
    ("NAME", r"[A-Za-z_][A-Za-z0-9_]*"),
    ("PUNCT", r"\^\^|&&|\|\||!=|<=|>=|[{}()\[\].;,*/|^+\-!?=<>]"),
    ("ERROR", r"."),
)
TOKEN_RE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in TOKEN_PARTS), re.DOTALL)


_UCHAR = r"\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}"
# The tokenizer with IRIs that may hold codepoint escapes (IRI_PATTERN's class or one); only
# unescape_iris runs it.
_ESCAPED_IRI = "<(?:" + IRI_PATTERN[1:-2] + "|" + _UCHAR + ")*>"


@functools.cache
def _escaped_tokens() -> re.Pattern[str]:
    """Compiled at its first use, not at import: `re` walks each of its name classes (some 54,000
    characters) one character at a time, 0.17-0.20 s at a load of 8 (a third of this module's
    import), which every process paid (each BOOSTER worker start), for requests that hold no escape."""
    return re.compile(
        "|".join(f"(?P<{kind}>{_ESCAPED_IRI if kind == 'IRI' else pattern})" for kind, pattern in TOKEN_PARTS),
        re.DOTALL,
    )


_UCHAR_RE = re.compile(_UCHAR)
# What a decoded IRI may hold: IRI_PATTERN's class without surrogates and without "'". Why no "'":
# `<` is also less-than, so `FILTER(1<2&&'\u0027'!='\u0027'&&3>2)` holds a span the tokenizer takes
# for an IRI; decoded, its strings became `'''` and the FILTER guarding a DELETE turned true (it
# deleted every triple). No "IRI" holding a quote is decoded, so no string's meaning can change.
_IRI_BODY = re.compile(r"[^<>\"'{}|^`\\\x00-\x20\ud800-\udfff]*")


def unescape_iris(text: str) -> str:
    """`text` with the codepoint escapes of its IRIs decoded: `<http://example.org/\\u00E9>` is
    `<http://example.org/é>` (SPARQL 1.1 §19.2 allows `\\u` and `\\U` anywhere).

    Why: the update path's tokenizer (and every piece of it that reads IRIs) takes IRIs without
    escapes, so an update or a subscription naming one was refused as a syntax error, while
    /query, parsed by pyoxigraph, took it. The gates decode once, on arrival, so access control
    and evaluation read the same IRIs. The text is left as it is when it holds no backslash-u (a
    substring test: nothing on the hot path), when only its strings hold escapes (their parsers
    decode them), for an "IRI" that holds a quote (see _IRI_BODY), and for an escape whose
    character no IRI may hold (a space, `>`, a surrogate): that one stays a syntax error.
    """
    if "\\u" not in text and "\\U" not in text:
        return text
    pieces: list[str] = []
    last = 0
    for match in _escaped_tokens().finditer(text):
        if match.lastgroup != "IRI" or "\\" not in match.group():
            continue
        try:
            iri = _UCHAR_RE.sub(lambda code: chr(int(code.group()[2:], 16)), match.group()[1:-1])
        except (ValueError, OverflowError):  # past U+10FFFF
            continue
        if _IRI_BODY.fullmatch(iri):
            pieces += [text[last : match.start()], "<", iri, ">"]
            last = match.end()
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def capturing(kind: str) -> re.Pattern[str]:
    """The tokenizer's expression with only `kind` captured: `findall` then lists, in C, the text of
    every token of that kind ('' for the others), where `tokenize` would cost a Python step each."""
    parts = (f"({pattern})" if name == kind else f"(?:{pattern})" for name, pattern in TOKEN_PARTS)
    return re.compile("|".join(parts), re.DOTALL)


# Token kinds that denote one RDF term or a variable.
TERM_KINDS = frozenset({"IRI", "PNAME", "BNODE", "VAR", "STRING", "NUMBER"})


class Token(NamedTuple):
    """One token; a tuple because tokenizing creates many of them on the update hot path."""

    kind: str
    text: str
    start: int

    @property
    def upper(self) -> str:
        return self.text.upper()

    def is_keyword(self, word: str) -> bool:
        return self.kind == "NAME" and self.text.upper() == word


def tokenize(text: str) -> list[Token]:
    """All significant tokens of `text` (whitespace and comments dropped).

    Raises SparqlSyntaxError, with line and column, on a character no SPARQL token starts with.
    """
    tokens: list[Token] = []
    append = tokens.append
    new = Token._make
    for match in TOKEN_RE.finditer(text):
        kind = match.lastgroup
        if kind == "WS" or kind == "COMMENT":
            continue
        if kind == "ERROR":
            line, column = line_column(text, match.start())
            raise SparqlSyntaxError(f"unexpected character {match.group()!r}", line, column)
        append(new((kind, match.group(), match.start())))
    return tokens


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset."""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def error_at(text: str, token: Token | None, message: str) -> SparqlSyntaxError:
    """A syntax error located at `token` (or at the end of the text when None)."""
    offset = token.start if token is not None else len(text)
    line, column = line_column(text, offset)
    found = f", found {token.text!r}" if token is not None else ", found end of request"
    return SparqlSyntaxError(f"{message}{found}", line, column)


def matching_brace(tokens: list[Token], open_index: int, text: str) -> int:
    """Index of the `}` (or `)` / `]`) closing the bracket at `open_index`."""
    opener = tokens[open_index].text
    closer = {"{": "}", "(": ")", "[": "]"}[opener]
    depth = 0
    for index in range(open_index, len(tokens)):
        token_text = tokens[index].text
        if tokens[index].kind != "PUNCT":
            continue
        if token_text == opener:
            depth += 1
        elif token_text == closer:
            depth -= 1
            if depth == 0:
                return index
    raise error_at(text, None, f"unbalanced {opener!r}")
