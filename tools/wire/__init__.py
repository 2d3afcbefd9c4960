"""The wire benchmark: the lighting workload sent to a real gateway over HTTP and WebSockets.

Why a second benchmark beside :mod:`tools.lighting`: that one measures the engine in-process, as
the paper does; this one measures what a client sees (HTTP parsing, the scheduler's thread hop,
JSON on the sockets) against a separate ``sepa-gateway run`` process, and puts an Oxigraph server
fed the same update stream beside it as the baseline of a bare SPARQL endpoint.
"""
