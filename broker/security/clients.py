"""The client registry: who may register, each client's graph rights, and the registrations made.

Two sources, merged: the operator's TOML (``[[security.clients]]``, read-only here) and the
registry file ``clients.json`` in the security directory, which the ``sepa-gateway clients`` CLI
and the gateway itself (registrations) change. For one identity the rights are the union of both;
``revoked`` in the file overrides the TOML. The file is rewritten whole and atomically under an
exclusive lock (``clients.lock``), so the CLI and a running gateway can change it at the same time;
the gateway notices a change by the file's (mtime, size, inode) on the next request.

Secrets: a client_secret is 32 random bytes, shown once in the registration reply. Only its SHA-256
is kept. Why not a slow password hash: the secret is random, not chosen by a person, so no
dictionary applies and 2^256 guesses cannot be made; a slow hash would only hand an attacker a
CPU-exhaustion lever on the token endpoint of a Raspberry Pi. Comparison is constant-time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.core.access import DEFAULT_GRAPH_IRI, GraphAccess
from broker.security.owned_files import make_directories, open_lock, read_file, write_file

log = logging.getLogger(__name__)

REGISTRY_FILE = "clients.json"
LOCK_FILE = "clients.lock"
ALL = "*"
DEFAULT = "default"  # how rights name the store's default graph
IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}")


class RegistryError(ValueError):
    """A registry operation that cannot be done (unknown identity, bad graph name...)."""


def check_identity(identity: str) -> str:
    if not isinstance(identity, str) or not IDENTITY.fullmatch(identity):
        raise RegistryError("a client identity is 1-128 characters: letters, digits and . _ @ : + - (not first)")
    return identity


def check_graph(graph: str) -> str:
    """A graph as rights name it: ``*`` (every graph), ``default`` or an absolute IRI."""
    if graph in (ALL, DEFAULT) or re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s<>\"{}|\\^`]*", graph):
        return graph
    raise RegistryError(f"not a graph: {graph!r} (use '*', 'default' or an absolute IRI)")


def _access_set(graphs: set[str]) -> frozenset[str] | None:
    if ALL in graphs:
        return None
    return frozenset(DEFAULT_GRAPH_IRI if graph == DEFAULT else graph for graph in graphs)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass
class Client:
    """One identity's merged policy and registration."""

    identity: str
    read: set[str] = field(default_factory=set)
    write: set[str] = field(default_factory=set)
    revoked: bool = False
    client_id: str | None = None
    secret_sha256: str | None = None
    registered: str | None = None
    from_config: bool = False

    @property
    def access(self) -> GraphAccess:
        return GraphAccess(_access_set(self.read), _access_set(self.write))

    def secret_matches(self, secret: str) -> bool:
        expected = self.secret_sha256 or ""
        return hmac.compare_digest(secret_digest(secret), expected) and bool(expected)

    def to_json(self) -> dict[str, Any]:
        return {
            "read": sorted(self.read),
            "write": sorted(self.write),
            "revoked": self.revoked,
            "client_id": self.client_id,
            "secret_sha256": self.secret_sha256,
            "registered": self.registered,
        }


class ClientRegistry:
    """The merged registry over one directory; :meth:`current` reloads it when the file changed."""

    def __init__(self, directory: Path, configured: list[dict[str, Any]] | None = None) -> None:
        self.directory = directory
        self.path = directory / REGISTRY_FILE
        self.configured = [configured_client(entry, position) for position, entry in enumerate(configured or [])]
        self._stamp: tuple[int, int, int] | None = None
        self._clients: dict[str, Client] = {}
        self._by_client_id: dict[str, Client] = {}
        self.generation = 0  # bumped when a reload finds the clients changed: watchers compare it
        self.current()

    # -- reading ------------------------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def current(self) -> dict[str, Client]:
        """The merged clients, reloaded when the file changed since the last look (one stat).

        A file that cannot be read (edited by hand, half-written by a tool other than ours) keeps
        the last good registry in force and is logged once per change; at start-up it is an error."""
        stamp = self._file_stamp()
        if stamp != self._stamp or self.generation == 0:
            try:
                self._load(stamp)
            except RegistryError as error:
                if self.generation == 0:
                    raise
                self._stamp = stamp  # not read again until it changes
                log.warning("client registry unreadable: the last good one stays in force", extra={"error": str(error)})
        return self._clients

    def _load(self, stamp: tuple[int, int, int] | None) -> None:
        clients = self._merged(self._read_file())
        # Why only on a change: watchers rescan every secure subscription when `generation` moves,
        # and every /oauth/register reloads under the lock, refused or not; bumped on each reload,
        # 5 refused registrations a second raised another client's p99 from 25.8 to 128 ms with
        # 10,000 subscriptions (/tmp/auth/t_watch_scan.py).
        if clients != self._clients or self.generation == 0:
            self._clients = clients
            self._by_client_id = {c.client_id: c for c in clients.values() if c.client_id}
            self.generation += 1
        self._stamp = stamp

    def _merged(self, stored: dict[str, dict[str, Any]]) -> dict[str, Client]:
        """The TOML's clients with the file's `stored` entries merged in."""
        clients: dict[str, Client] = {}
        for identity, read, write in self.configured:
            clients[identity] = Client(identity, set(read), set(write), from_config=True)
        for identity, entry in stored.items():
            client = clients.setdefault(identity, Client(identity))
            client.read |= set(entry.get("read", ()))
            client.write |= set(entry.get("write", ()))
            client.revoked = bool(entry.get("revoked", False))
            client.client_id = entry.get("client_id")
            client.secret_sha256 = entry.get("secret_sha256")
            client.registered = entry.get("registered")
        return clients

    def _read_file(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(read_file(self.path).decode("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise RegistryError(f"cannot read {self.path}: {error}") from error
        clients = data.get("clients", {}) if isinstance(data, dict) else {}
        return clients if isinstance(clients, dict) else {}

    def by_client_id(self, client_id: str) -> Client | None:
        self.current()
        return self._by_client_id.get(client_id)

    def registrations(self) -> dict[str, Client]:
        """The registered clients by client_id, as they are now (one stat). A reload replaces the
        dict, never changes it, so it is a snapshot: the revocation watch checks every secure
        subscription against one, not with a stat each."""
        self.current()
        return self._by_client_id

    def get(self, identity: str) -> Client | None:
        return self.current().get(identity)

    # -- changing -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The stored entries under the lock; written back (atomically, 0600) when the block ends.

        The lock and the file are owned like the directory (the service user's) and never opened
        through a symlink: the CLI runs as root in a directory that user controls (owned_files)."""
        make_directories(self.directory)
        with os.fdopen(open_lock(self.directory / LOCK_FILE), "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            stored = self._read_file()
            yield stored
            write_file(self.path, json.dumps({"clients": stored}, indent=2, sort_keys=True).encode("utf-8"))
        self._load(self._file_stamp())

    def _entry(self, stored: dict[str, dict[str, Any]], identity: str) -> dict[str, Any]:
        entry = stored.setdefault(identity, {})
        entry.setdefault("read", [])
        entry.setdefault("write", [])
        return entry

    def add(self, identity: str, read: list[str] = (), write: list[str] = ()) -> Client:  # type: ignore[assignment]
        """Allow `identity` to register (again, if it was revoked), with these rights added."""
        return self._change(identity, read, write, allow=True)[0]

    def add_and_register(
        self, identity: str, now: str, read: list[str] = (), write: list[str] = ()
    ) -> tuple[Client, str]:  # type: ignore[assignment]
        """:meth:`add` and :meth:`register` in one locked edit; the client and its secret.

        Why one edit: as two, the file said "allowed, not registered" in between, and a network
        /oauth/register polling for the name took the identity in 8 races of 10
        (/tmp/auth/t_race_register.py); the operator's command then failed."""
        client, secret = self._change(identity, read, write, allow=True, register_at=now)
        assert secret is not None
        return client, secret

    def allow(self, identity: str, read: list[str] = (), write: list[str] = ()) -> Client:  # type: ignore[assignment]
        """Add rights to a known identity."""
        if identity not in self.current():
            raise RegistryError(f"no client {identity!r} (add it first)")
        return self.add(identity, read, write)

    def revoke(self, identity: str, read: list[str] = (), write: list[str] = ()) -> Client:  # type: ignore[assignment]
        """Without graphs: revoke the client (its tokens and registration stop working at once).
        With graphs: remove those rights (only rights the CLI gave; the TOML's stay)."""
        client = self.current().get(identity)
        if client is None:
            raise RegistryError(f"no client {identity!r}")
        configured = next(((r, w) for i, r, w in self.configured if i == identity), ((), ()))
        kept = [g for g in read if g in configured[0]] + [g for g in write if g in configured[1]]
        if kept:
            raise RegistryError(f"{kept[0]!r} is granted in the TOML file: remove it there")
        with self._editing() as stored:
            entry = self._entry(stored, identity)
            if read or write:
                entry["read"] = sorted(set(entry["read"]) - set(read))
                entry["write"] = sorted(set(entry["write"]) - set(write))
            else:
                entry.update(revoked=True, client_id=None, secret_sha256=None, registered=None)
        return self._clients[identity]

    def reset(self, identity: str) -> Client:
        """Forget `identity`'s registration: anyone may register it over the network once more."""
        return self._change(identity, reset=True)[0]

    def reset_and_register(self, identity: str, now: str) -> tuple[Client, str]:
        """Forget `identity`'s registration and register it anew in one locked edit; the client and
        its new secret. Why: after a plain reset, whoever stole the old secret knows the name and
        registers it first over the network, so the rotation gave the thief a fresh secret."""
        client, secret = self._change(identity, reset=True, register_at=now)
        assert secret is not None
        return client, secret

    def register(self, identity: str, now: str) -> tuple[Client, str]:
        """Register an allowed identity once; returns the client and its secret (shown only now)."""
        client, secret = self._change(identity, register_at=now)
        assert secret is not None
        return client, secret

    def _change(
        self,
        identity: str,
        read: list[str] = (),  # type: ignore[assignment]
        write: list[str] = (),  # type: ignore[assignment]
        *,
        allow: bool = False,
        reset: bool = False,
        register_at: str | None = None,
    ) -> tuple[Client, str | None]:
        """One locked edit of `identity`: `allow` it (un-revoke, add rights), `reset` its
        registration, then register it at `register_at` (its secret is returned), in that order,
        each decided on the file as it is under the lock. Nothing is written when one is refused."""
        if allow:
            check_identity(identity)
        graphs_read, graphs_write = [check_graph(g) for g in read], [check_graph(g) for g in write]
        secret = None
        with self._editing() as stored:
            if reset and not allow and identity not in self._merged(stored):
                raise RegistryError(f"no client {identity!r}")
            if allow:
                entry = self._entry(stored, identity)
                entry["read"] = sorted(set(entry["read"]) | set(graphs_read))
                entry["write"] = sorted(set(entry["write"]) | set(graphs_write))
                entry["revoked"] = False
            if reset:
                self._entry(stored, identity).update(client_id=None, secret_sha256=None, registered=None)
            if register_at is not None:
                secret = self._register_entry(stored, identity, register_at)
        return self._clients[identity], secret

    def _register_entry(self, stored: dict[str, dict[str, Any]], identity: str, now: str) -> str:
        """Register `identity` in `stored` (under the lock); its new secret. The reasons refused
        are told to the operator; the network is told one text for all (Authority.register)."""
        client = self._merged(stored).get(identity)
        if client is None:
            raise RegistryError("this client identity is not allowed to register")
        if client.revoked:
            raise RegistryError("this client identity is revoked (the operator can add it again)")
        if client.client_id:
            raise RegistryError("this client identity is already registered (the operator can reset it)")
        secret = secrets.token_urlsafe(32)
        self._entry(stored, identity).update(
            client_id=str(uuid.uuid4()), secret_sha256=secret_digest(secret), registered=now
        )
        return secret


def configured_client(entry: Any, position: int) -> tuple[str, list[str], list[str]]:
    """(identity, read, write) of the TOML's ``security.clients[position]``, checked."""
    where = f"security.clients[{position}]"
    if not isinstance(entry, dict):
        raise RegistryError(f"{where} must be a table")
    unknown = set(entry) - {"identity", "read", "write"}
    if unknown:
        raise RegistryError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: identity, read, write)")
    try:
        identity = check_identity(entry.get("identity", ""))
    except RegistryError as error:
        raise RegistryError(f"{where}.identity: {error}") from None
    rights: list[list[str]] = []
    for key in ("read", "write"):
        graphs = entry.get(key, [])
        if not isinstance(graphs, list) or not all(isinstance(graph, str) for graph in graphs):
            raise RegistryError(f"{where}.{key} must be a list of graphs")
        try:
            rights.append([check_graph(graph) for graph in graphs])
        except RegistryError as error:
            raise RegistryError(f"{where}.{key}: {error}") from None
    return identity, rights[0], rights[1]
