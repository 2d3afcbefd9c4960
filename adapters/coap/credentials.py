"""The OSCORE contexts the CoAP server knows, loaded from the sensors' directory and kept current.

`sepa-gateway sensors add NAME --coap` writes a context while the gateway runs; the server picks it
up within RELOAD_INTERVAL_S (the directory's modification time changes when a sensor is added or
removed), with no restart. Without aiocoap's OSCORE modules (lakers has no wheel for 32-bit ARM),
there is no OSCORE: peers on the network are then refused when security is on, never let in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

from aiocoap.credentials import CredentialsMap

from adapters.coap.queries import pipe_ended
from broker.api import sync_directory
from gateway.appliance import oscore_sensors as oscore

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 2.0
# the OSCORE option's first byte: its low three bits are the Partial IV length, 6 and 7 reserved
PARTIAL_IV_LENGTH = 0x07
RESERVED_PIV_LENGTHS = (6, 7)
# why aiocoap's wrapper refuses a protected request (counted, sepa_coap_oscore_refused_<reason>): no
# context for its kid (4.01), a replayed sequence number (4.01, or 4.01 with Echo), a COSE object it
# cannot decode (4.02), one that does not decrypt (4.00), a method OSCORE does not carry outside (4.05)
OSCORE_REFUSALS = ("unknown_context", "replay", "decode", "decryption", "method")
REPLAY_DETECTED = b"Replay detected"  # the payload of aiocoap's unprotected 4.01 for a replay
CONTEXT_GONE = b"Security context not found"  # what ends an observation whose sensor's context went
UNKNOWN_NONCES = "the sequence numbers this key used are unknown"  # why a damaged sequence.json refuses its sensor


def load_context(folder: Path) -> Any:
    """aiocoap's security context of the sensor in `folder`; raises DamagedContext when it cannot be
    used, its folder left as it was.

    Why not aiocoap's `load_from_dict`: a context that failed to load kept its lock file and left
    aiocoap's destructor to run on the half-made object. With a sequence.json that was empty or not
    JSON, that destructor printed an "Exception ignored" AttributeError traceback on stderr (8 lines
    after the error line, per sensor and per reload); with one that had a number but no replay window
    (`{"next-to-send": 7}`), it rewrote the file into a loadable one with an empty window, so the next
    start accepted the context it had just refused. And a negative number was loaded.

    Why refused, not recovered: sequence.json is what says which sequence numbers (the nonces of the
    gateway's responses) this key has used and which of the sensor's requests were seen. Starting
    again from a guess reuses an AES-CCM nonce under the same key, or accepts a recorded request
    again. Only a new key is safe, and only the operator can give the sensor one.
    """
    from aiocoap.oscore import MAX_SEQNO

    problem = sequence_problem(folder / "sequence.json", MAX_SEQNO)
    if problem:
        raise DamagedContext(problem)
    durable = _durable_context_type()
    context = durable.__new__(durable)
    try:
        context.__init__(f"{folder}/")
    except Exception as error:
        lock = getattr(context, "lockfile", None)
        if lock is not None:
            context.lockfile = None  # aiocoap's destructor then leaves the object alone
            lock.release()
            with contextlib.suppress(OSError):
                os.unlink(lock.lock_file)
        raise DamagedContext(str(error) or type(error).__name__) from None
    return context


@functools.cache
def _durable_context_type() -> type:
    """aiocoap's FilesystemSecurityContext, with each sequence.json it writes made durable before
    the numbers it reserves are used.

    Why: aiocoap syncs its temporary file and renames it over sequence.json, and never syncs the
    directory, so the rename reaches the disk at the file system's next commit (ext4: up to 5 s
    later). A power cut before it brings back the previous file, whose `next-to-send` is below
    numbers already used in responses: the next start used them again, an AES-CCM nonce twice
    under one key (strace of a gateway as installed: the rename, then the protected response sent,
    and no fsync of the sensor's directory). One directory fsync per chunk of numbers reserved (10,
    doubling up to 10,000), not per message."""
    from aiocoap.oscore import FilesystemSecurityContext

    class DurableSecurityContext(FilesystemSecurityContext):  # type: ignore[misc]
        def _store(self) -> None:
            super()._store()
            sync_directory(Path(self.basedir))

    return DurableSecurityContext


def sequence_problem(path: Path, max_seqno: int) -> str:
    """What is wrong with a context's sequence.json, or "" (absent is right: a new sensor's)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return f"sequence.json is damaged (not JSON): {UNKNOWN_NONCES}"
    sent = record.get("next-to-send") if isinstance(record, dict) else None
    if type(sent) is not int or not 0 <= sent <= max_seqno or "received" not in record:
        return f"sequence.json is damaged (no sequence number or replay window): {UNKNOWN_NONCES}"
    return ""


class DamagedContext(Exception):
    """A sensor's context that cannot be loaded (the message says why, in one line)."""


class ContextReleased(Exception):
    """A released context (its sensor removed or reset) was asked for a sequence number: what a
    live observation of that sensor meets at its next notification."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


class RefusalCounter:
    """What aiocoap's OSCORE wrapper is given instead of the request's pipe: the same pipe, with its
    4.01 for a replay counted (the wrapper answers it itself, raising nothing)."""

    def __init__(self, pipe: Any, refused: Counter[str]) -> None:
        self._pipe = pipe
        self.request = pipe.request
        self._refused = refused

    def add_response(self, response: Any, is_last: bool = False) -> None:
        if response.opt.oscore is None and response.payload == REPLAY_DETECTED:
            self._refused["replay"] += 1
        self._pipe.add_response(response, is_last=is_last)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class SensorCredentials:
    """aiocoap's credentials map of the sensors in `directory`, reloaded when the directory changes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.map = CredentialsMap()
        self.count = 0
        self.malformed = 0  # requests whose OSCORE option could not be decoded (answered 4.02)
        self.refused: Counter[str] = Counter()  # protected requests aiocoap's wrapper refused, by OSCORE_REFUSALS
        self.ended_while_responding = 0  # protected responses that found their observation gone
        self.ended_released = 0  # protected observations ended because their sensor was removed or reset
        self._said_released: set[str] = set()  # the released sensors already named in the log
        self.kids: frozenset[bytes] = frozenset()  # what the sensors' requests carry: their contexts' recipient ids
        self._stamp: int | None = None
        self._loaded: dict[str, object] = {}  # label -> its key material when loaded (_key_material)
        self.paths: dict[str, tuple[str, ...]] = {}  # sensor -> its extra path patterns (paths.json)
        self._paths_stamps: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.reload()

    def wrap(self, site: Any) -> Any:
        """`site` behind aiocoap's OSCORE wrapper (requests protected by a known context are verified
        and marked authenticated; others pass through as they are), or `site` without OSCORE."""
        try:
            from aiocoap import error, oscore
            from aiocoap.numbers.codes import FETCH, POST
            from aiocoap.oscore_sitewrapper import OscoreSiteWrapper
        except ImportError as missing:
            log.warning("coap: no OSCORE (%s): network peers cannot authenticate", missing)
            return site
        owner = self

        class Wrapper(OscoreSiteWrapper):  # type: ignore[misc]
            """aiocoap's wrapper, answering a malformed OSCORE option 4.02 Bad Option (RFC 8613 §8.2)
            and counting it. Why: aiocoap let what `verify_start` raised on one fly (a DecodeError, or
            an IndexError of its option parser), a 5.00 and an ERROR traceback (~20 log lines) per
            datagram, from any host, with no credentials. A Partial IV length of 6 or 7 (reserved,
            RFC 8613 §6.1) passes its parser and failed an assertion when the nonce was built: with
            the kid of a known sensor (sent in clear by that sensor), 4,000 datagrams wrote 5.8 MB
            of tracebacks.

            A protected observation whose peer went away while a notification was being added
            failed inside aiocoap's pipe (a TypeError, then a second one logging it) and left "Task
            exception was never retrieved" ERROR tracebacks: it is counted and ends quietly.

            The requests it refuses are counted by reason (OSCORE_REFUSALS): 49 replays and 50
            unknown kids were 4.01s seen only as aiocoap notices.

            A protected observation whose sensor was removed or reset (its context released) ends at
            its next notification with an unprotected 4.01, counted, one log line per sensor: it
            wrote ~30 lines of ERROR traceback per observation (a FileNotFoundError of aiocoap's
            sequence file, or an AttributeError of the destroyed context's keys)."""

            async def render_to_pipe(self, pipe: Any) -> None:
                try:
                    unprotected = oscore.verify_start(pipe.request)  # cheap: the option's fields, no cryptography
                    reserved = (pipe.request.opt.oscore or b"\0")[0] & PARTIAL_IV_LENGTH in RESERVED_PIV_LENGTHS
                except oscore.NotAProtectedMessage:
                    unprotected, reserved = None, False
                except Exception:  # whatever a malformed option makes the parser raise
                    unprotected, reserved = None, True
                if reserved:
                    owner.malformed += 1
                    raise error.BadOption("malformed OSCORE option") from None
                if unprotected is not None and pipe.request.code in (FETCH, POST):
                    try:
                        self.server_credentials.find_oscore(unprotected)  # a lookup by kid
                    except KeyError:
                        owner.refused["unknown_context"] += 1  # NON ones too, which aiocoap drops unanswered
                try:
                    await super().render_to_pipe(RefusalCounter(pipe, owner.refused))
                except oscore.ReplayErrorWithEcho:
                    owner.refused["replay"] += 1
                    raise
                except error.MethodNotAllowed:
                    owner.refused["method"] += 1
                    raise
                except error.BadOption:
                    owner.refused["decode"] += 1
                    raise
                except error.BadRequest:
                    owner.refused["decryption"] += 1
                    raise
                except ContextReleased as released:
                    owner.end_released(pipe, released.label)
                except Exception:
                    if not pipe_ended(pipe):
                        raise
                    owner.ended_while_responding += 1

        return Wrapper(site, self.map)

    def end_released(self, pipe: Any, label: str) -> None:
        """End a protected observation whose context was released: counted, an unprotected 4.01
        (what a request with that kid now gets), the sensor named once in the log."""
        from aiocoap import Message
        from aiocoap.numbers.codes import UNAUTHORIZED

        self.ended_released += 1
        if label not in self._said_released:
            self._said_released.add(label)
            log.info("coap: observations of a removed or reset sensor ended", extra={"sensor": label[1:]})
        if not pipe_ended(pipe):
            with contextlib.suppress(Exception):  # the peer may be gone meanwhile
                pipe.add_response(Message(code=UNAUTHORIZED, max_age=0, payload=CONTEXT_GONE), is_last=True)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="coap-credentials")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def may_post(self, sensor: str, path: str) -> bool:
        """Whether `sensor` may post a reading to `path` (for :class:`~adapters.coap.access.Access`)."""
        return oscore.may_post(sensor, self.paths.get(sensor, ()), path)

    def _reload_paths(self) -> None:
        """Re-read the path patterns whose file changed: a stat per sensor and tick."""
        for label in list(self.map):
            name = label[1:]
            path = self.directory / name / oscore.PATHS_FILE
            try:
                stamp = path.stat().st_mtime_ns
            except OSError:
                stamp = -1
            if self._paths_stamps.get(name) != stamp:
                self._paths_stamps[name] = stamp
                self.paths[name] = oscore.allowed_paths(self.directory / name)
        for name in [name for name in self.paths if f":{name}" not in self.map]:
            self.paths.pop(name)
            self._paths_stamps.pop(name, None)

    def reload(self) -> None:
        """Load what changed in the directory since the last look: new sensors, removed ones, reset
        ones, and changed path patterns.

        Contexts that did not change are kept as they are: aiocoap holds a lock file in each context
        directory for as long as its context object lives, so loading one twice would fail.
        """
        try:
            stamp = self.directory.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp == self._stamp and self._stamp is not None:
            self._reload_paths()
            return
        wanted = oscore.credentials(self.directory)
        self._stamp = stamp  # only now: a reload that failed is tried again at the next tick
        for label in [label for label in self.map if label not in wanted or self._changed(label)]:
            self._release(label)
        for label, entry in wanted.items():
            if label in self.map:
                continue
            try:
                material = self._key_material(label)
                self.map[label] = load_context(Path(entry["oscore"]["basedir"]))
                self.map[label].authenticated_claims = [label]  # what aiocoap's load_from_dict sets
                self._loaded[label] = material
            except Exception as error:  # a damaged context: said, and the other sensors still work
                log.error(
                    "coap: cannot load an OSCORE context; the sensor is refused until it gets a new key "
                    "(sepa-gateway sensors add NAME --coap --reset)",
                    extra={"sensor": label[1:], "error": str(error)[:200]},
                )
        if len(self.map) != self.count:
            log.info("coap: OSCORE sensors loaded", extra={"sensors": len(self.map)})
        self.count = len(self.map)
        ids = (getattr(context, "recipient_id", None) for context in self.map.values())
        self.kids = frozenset(kid for kid in ids if isinstance(kid, bytes))
        self._reload_paths()

    def _key_material(self, label: str) -> object:
        """What a context is made of: its files' parsed content (ids, secret, salt, algorithm...),
        or a fresh object (equal to nothing) when they cannot be read."""
        folder = self.directory / label[1:]
        material: list[Any] = []
        for name in ("secret.json", "settings.json"):  # what aiocoap's context loads its keys from
            try:
                material.append(json.loads((folder / name).read_text()))
            except FileNotFoundError:
                material.append(None)
            except (OSError, ValueError):
                return object()
        return material

    def _changed(self, label: str) -> bool:
        """Whether the sensor's key changed (a reset): its key material, not its files' times. Why:
        a settings.json touched, restored from a backup or copied by rsync without -t, then any
        change of the directory, made the same key load again from sequence 0 (sequence.json
        deleted), so replayed requests were accepted and the gateway reused its nonces."""
        return self._loaded.get(label) != self._key_material(label)

    def _release(self, label: str) -> None:
        """Forget a removed or reset context. aiocoap writes its sequence numbers back and lets go of
        its lock file when the object goes; a reset sensor's new secret then starts from a clean state."""
        context = self.map.pop(label)
        self._loaded.pop(label, None)
        self._said_released.discard(label)

        def released() -> int:
            raise ContextReleased(label)

        # a live observation protected by it must not take another sequence number: aiocoap would
        # write it to the sensor's folder (gone, or the new key's) and then fail on the destroyed keys
        context.new_sequence_number = released
        destroy = getattr(context, "_destroy", None)  # aiocoap's own release (what its __del__ calls)
        if destroy is not None and getattr(context, "lockfile", None) is not None:
            with contextlib.suppress(OSError):  # the directory went with the sensor
                destroy()
            if getattr(context, "lockfile", None) is not None:  # destroy failed half way: not again at __del__
                with contextlib.suppress(Exception):
                    context.lockfile.release()
                context.lockfile = None
        stale = self.directory / label[1:] / "sequence.json"
        if (self.directory / label[1:] / "settings.json").is_file():
            stale.unlink(missing_ok=True)  # written by the old context: not the new secret's

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_INTERVAL_S)
            try:
                self.reload()
            except Exception:  # noqa: BLE001 - a damaged directory must not end the watch for good
                log.exception("coap: cannot reload the sensor credentials; trying again")
