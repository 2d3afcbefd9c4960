"""Errors the engine raises: each maps to one SPARQL 1.1 SE Protocol error (PROTOCOL.md).

The gates turn these into `{"error", "error_description", "status_code"}` JSON, so every error
carries its wire name and HTTP status here, once, instead of in every gate.
"""

from __future__ import annotations


class SepaError(Exception):
    """Base class: a request the engine refused. Nothing was changed."""

    error = "internal_error"
    status_code = 500

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description

    def to_json(self) -> dict[str, object]:
        return {"error": self.error, "error_description": self.description, "status_code": self.status_code}


class SparqlSyntaxError(SepaError):
    """Malformed SPARQL; the description names line and column."""

    error = "invalid_request"
    status_code = 400

    def __init__(self, description: str, line: int | None = None, column: int | None = None) -> None:
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"SPARQL syntax error{where}: {description}")
        self.line = line
        self.column = column


class InvalidRequest(SepaError):
    """Well-formed SPARQL that cannot be executed as asked (bad graph parameters, LOAD disabled...)."""

    error = "invalid_request"
    status_code = 400


class ResultTooLarge(SepaError):
    """A result past a size limit of the gateway (a query's body, a subscription's rows, a
    notification's characters). 413, not 400: the SEPA clients' secure wrappers (sepa-js
    `SecureSubscriptionWrapper`) take any 400 for an expired token and subscribe again, so a
    subscription ended at its row limit had a secure sepa-js application ask for hundreds of tokens
    a second, then crash, the error never reaching it; a 413 is handed to the application."""

    error = "result_too_large"
    status_code = 413


class UpdateFailed(SepaError):
    """An update operation failed at run time (e.g. CREATE of an existing graph); nothing changed."""

    error = "update_failed"
    status_code = 400


class NotFound(SepaError):
    """Unknown subscription or resource."""

    error = "not_found"
    status_code = 404


class Unauthorized(SepaError):
    """No valid token (missing, expired, forged, wrong algorithm or issuer, revoked client).

    Always 401 ``invalid_grant``: old SEPA clients renew their token on a 401 and treat a 400 alike,
    so token problems are never answered with anything else (PROTOCOL.md "OAuth 2.0").
    """

    error = "invalid_grant"
    status_code = 401


class Forbidden(SepaError):
    """A valid client asked for something its rights do not cover (a graph it may not read or write)."""

    error = "forbidden"
    status_code = 403


class TimeLimitExceeded(SepaError):
    """A query, subscription or update WHERE ran past its wall-clock limit; it was stopped, nothing changed."""

    error = "timeout"
    status_code = 503


class MemoryLimitExceeded(SepaError):
    """A query, subscription or update WHERE needed more memory than an evaluation may take in a query
    worker; it was stopped, nothing changed."""

    error = "memory_limit"
    status_code = 503

    @classmethod
    def past(cls, memory_bytes: int) -> MemoryLimitExceeded:
        return cls(
            f"the evaluation needed more than its memory limit of {memory_bytes >> 20} MB "
            "([engine] query_memory_mb) and was stopped"
        )


class EvaluationCrashed(SepaError):
    """The evaluation of a request killed the worker process it ran in (the gateway itself is unaffected)."""

    error = "evaluation_crashed"
    status_code = 500


class StoreFailed(SepaError):
    """The store on disk could not write (its disk full, or failing). Whether the update is stored is
    known once the gateway has started again: it stops at the first such error, for its service
    manager to start it again (reopening is what brings pyoxigraph's RocksDB out of its error
    state; :attr:`broker.store.RdfStore.failed`)."""

    error = "store_failed"
    status_code = 503


class StoreFull(SepaError):
    """An update that would add to the store while the machine is short of memory
    (:mod:`broker.headroom`): nothing was changed; it may succeed once deletions or retention free
    some."""

    error = "store_full"
    status_code = 507


class WorkerLost(SepaError):
    """A job queued behind another on a worker that was killed or died before it ran (see
    :meth:`broker.workers.pool.QueryWorkers.dispatch`): not this job's fault; it may be tried again."""

    error = "worker_lost"
    status_code = 503
