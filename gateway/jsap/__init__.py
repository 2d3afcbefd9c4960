"""JSON SPARQL Application Profile (JSAP): load, validate, resolve endpoints, bind forced variables.

    jsap = Jsap.load("examples/chat/chat.jsap")
    jsap.update_url("SEND")                      # http://localhost:8000/update
    jsap.update_text("SEND", {"sender": "chat:PersonURI1", "receiver": "chat:PersonURI2", "text": 'Hi "you"'})
    jsap.subscribe_url("SENT"), jsap.query_text("SENT", {"receiver": "chat:PersonURI2"})

See PROTOCOL.md, section JSAP. Modules: `profile` (the Jsap class), `loader` (validation and
defaults), `model` (resolved objects), `template` (where forced variables sit in the SPARQL),
`terms` (writing RDF terms so that no value can change the shape of the SPARQL).
"""

from gateway.jsap.errors import JsapError
from gateway.jsap.model import (
    Entry,
    ForcedBinding,
    Graphs,
    HttpOperation,
    OAuth,
    Sparql11Protocol,
    Sparql11SEProtocol,
    WsGate,
)
from gateway.jsap.profile import Jsap
from gateway.jsap.terms import RdfTerm, binding_term

__all__ = [
    "Entry",
    "ForcedBinding",
    "Graphs",
    "HttpOperation",
    "Jsap",
    "JsapError",
    "OAuth",
    "RdfTerm",
    "Sparql11Protocol",
    "Sparql11SEProtocol",
    "WsGate",
    "binding_term",
]
