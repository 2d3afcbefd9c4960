"""The gateway's one base IRI, for the relative IRIs of a request, whatever gate or transport it came by.

Why one: the SPARQL Protocol's default (the endpoint's own URL) makes the same request mean different
data through 127.0.0.1 and through localhost, through HTTP and HTTPS, or through a WebSocket (where
it had no base at all and `<integration>` was a syntax error). SEPA clients' test profiles use such
IRIs. A request's own BASE still wins: it comes after the gateway's in the prologue.
"""

from __future__ import annotations

import re

# an IRI reference without a scheme; `<` as less-than (`?x<3&&?y>2`) may match too, and then the
# BASE declaration is prepended for nothing (it changes no meaning)
_RELATIVE_IRI = re.compile(r"<(?![A-Za-z][A-Za-z0-9+.-]*:)[^<>\"{}|^`\\\x00-\x20]*>")


def with_base(sparql: str, base_iri: str | None) -> str:
    """`sparql` with `BASE <base_iri>` in front when it has a relative IRI (else unchanged).

    On the same line, so that error positions keep their line numbers."""
    if base_iri is None or "<" not in sparql or _RELATIVE_IRI.search(sparql) is None:
        return sparql
    return f"BASE <{base_iri}> {sparql}"
