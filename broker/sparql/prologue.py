"""PREFIX and BASE declarations followed through a token stream, resolved as pyoxigraph does.

For the readers that find a few clauses in a request's tokens without parsing it (SERVICE
endpoints: :mod:`broker.sparql.service`; FROM graphs: :mod:`broker.sparql.datasets`): an IRI or
prefixed name there means what the declarations before it make it mean.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

from broker.sparql.tokens import Token

_LOCAL_ESCAPE = re.compile(r"\\(.)")


class Prologue:
    """The prefixes and base declared so far (starting from the protocol's)."""

    def __init__(self, prefixes: dict[str, str] | None = None, base: str | None = None) -> None:
        self.declared = dict(prefixes or {})
        self.base = base

    def follow(self, word: str, following: list[Token]) -> bool:
        """Take the declaration that keyword `word` starts, `following` being its next two tokens;
        whether it was one."""
        if word == "PREFIX" and len(following) == 2 and following[0].kind == "PNAME":
            self.declared[following[0].text[:-1]] = self.resolve(following[1].text[1:-1])
            return True
        if word == "BASE" and following and following[0].kind == "IRI":
            self.base = self.resolve(following[0].text[1:-1])
            return True
        return False

    def resolve(self, iri: str) -> str:
        """A relative IRI against the base."""
        return urljoin(self.base, iri) if self.base else iri

    def iri(self, token: Token, *, unescape: bool = True) -> str | None:
        """The IRI an IRI or prefixed-name token stands for; None for another token or an
        undeclared prefix. `unescape`: drop the backslashes of local-name escapes (pyoxigraph does)."""
        kind, text, _ = token
        if kind == "IRI":
            return self.resolve(text[1:-1])
        if kind == "PNAME":
            prefix, _, local = text.partition(":")
            if prefix in self.declared:
                return self.declared[prefix] + (_LOCAL_ESCAPE.sub(r"\1", local) if unescape else local)
        return None
