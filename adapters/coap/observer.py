"""The gateway as an observer (RFC 7641) of its sensors' CoAP resources: each notification a reading.

Sensors that serve their values rather than send them (an observable `/temperature`, as most
constrained CoAP stacks offer) are listed in the config file and in the mappings graph, like the
topic mappings (the Topics Manager: a SPARQL update adds or removes one, and it is observed or left
at once, without a restart)::

    [[coap.observe]]
    uri = "coap://[2001:db8::5]/temperature"
    source = "s/boiler/temperature"      # optional: the uri's path ("temperature") when absent

    <urn:…> a gw:CoapObservation ; gw:uri "coap://[2001:db8::5]/temperature" ; gw:source "s/boiler/temperature" .

A notification's payload is mapped as if it had been POSTed to `/<source>` (same mappings and
profiles, same content formats: :func:`adapters.coap.readings.payload_readings`) and committed by the
same batcher, so `source` is what the mappings match: "s/boiler/temperature" takes the
`s/{sensor}/{property}` profile. Each notification is stored once (aiocoap drops retransmitted and
reordered ones); the first response of every registration is a reading too (it is the resource's
current value).

Why re-register, and when: an observation ends without a word when the sensor reboots (it forgot its
observers) or the gateway restarts (its token is gone), and with one on an error, a reset or a
final response. So each observation also expects a notification within the last one's Max-Age
(60 s when absent, RFC 7252 §5.10.5) plus `margin_s`, and re-registers when none came. A failed
registration is retried after 1 s, doubling up to `backoff_max_s` (with ±20 % jitter so that many
sensors lost together do not come back together); an observation that had lasted `backoff_max_s`
starts again from 1 s, one that keeps ending sooner backs off like a failure. A gateway start
registers everything anew.

Block-wise notifications (RFC 7959 §2.6): a representation larger than one datagram comes as its
first block, and the gateway asks for the others itself, each with a GET of its own. aiocoap
assembled them without any limit, so one sensor (or anyone who can answer for it) that never says
"last block" grew the gateway's memory for ever, a block per round trip. Here a notification is
assembled up to `[coap] max_payload_bytes` (the bound of a POSTed reading) within
REGISTER_TIMEOUT_S; one past it, or whose blocks do not follow on, is counted as a bad payload of
its resource and the observation goes on. Notifications are taken in the order they came, so one
waiting for its blocks holds those after it (at most MAX_WAITING; more are counted and dropped).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiocoap
from aiocoap import Code
from aiocoap.optiontypes import BlockOption
from pyoxigraph import Literal, NamedNode

from adapters.coap.batcher import Overloaded
from adapters.coap.errors import Refused
from adapters.coap.readings import payload_readings
from adapters.coap.targets import ObserveError, ObserveTarget
from gateway.client import ClientSubscription, SepaClient
from gateway.observations import Mapper, PayloadError, Reading
from gateway.observations.counters import SourceCounters
from gateway.observations.vocabulary import COAP_OBSERVATION, GRAPH_MAPPINGS, GW, RDF_TYPE

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0  # a registration unanswered this long failed (a confirmable request alone retries for 93 s)
FIRST_BACKOFF_S = 1.0
DEFAULT_MAX_AGE_S = 60
MAX_WAITING = 8  # notifications held behind one whose blocks are being fetched

OBSERVE_QUERY = (
    f"SELECT ?observation ?uri ?source WHERE {{ GRAPH <{GRAPH_MAPPINGS}> {{\n"
    f"  ?observation a <{COAP_OBSERVATION}> ; <{GW}uri> ?uri .\n"
    f"  OPTIONAL {{ ?observation <{GW}source> ?source }}\n}} }}"
)

Store = Callable[[Sequence[Reading]], Awaitable[None]]


def observe_update(targets: Sequence[ObserveTarget]) -> str:
    """An update (re)writing these targets in the mappings graph, leaving the others alone."""
    graph = f"<{GRAPH_MAPPINGS}>"
    operations = [f"DELETE WHERE {{ GRAPH {graph} {{ <{target.node}> ?p ?o }} }}" for target in targets]
    triples = "".join(
        f"<{target.node}> <{RDF_TYPE}> <{COAP_OBSERVATION}> ; <{GW}uri> {Literal(target.uri)} ; "
        f"<{GW}source> {Literal(target.source)} .\n"
        for target in targets
    )
    return " ;\n".join([*operations, f"INSERT DATA {{ GRAPH {graph} {{\n{triples}}} }}"])


def targets_from_rdf(rows: Iterable[Mapping[str, Any]], errors: list[ObserveError]) -> list[ObserveTarget]:
    """The targets in rows of OBSERVE_QUERY; one that cannot work is appended to `errors` and skipped."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(_text(row["observation"]), []).append(row)
    targets: list[ObserveTarget] = []
    for node, node_rows in grouped.items():
        uris = {_text(row["uri"]) for row in node_rows}
        sources = {_text(row["source"]) for row in node_rows if row.get("source") is not None}
        try:
            if len(uris) > 1 or len(sources) > 1:
                raise ObserveError("more than one gw:uri or gw:source")
            targets.append(ObserveTarget.of(uris.pop(), sources.pop() if sources else None))
        except ObserveError as error:
            errors.append(ObserveError(f"<{node}>: {error}"))
    return list(dict.fromkeys(targets))


def _text(term: Any) -> str:
    return term.value if isinstance(term, NamedNode | Literal) else str(term)


@dataclass
class ObserveStats:
    """Counters of one observed resource (health shows them per resource, metrics their sums)."""

    registrations: int = 0  # registrations that succeeded
    failures: int = 0  # registrations that did not (no answer, an error code, not observable)
    losses: int = 0  # observations that ended after they had started
    notifications: int = 0
    readings: int = 0  # readings committed
    bad_payloads: int = 0  # notifications no mapping took or whose payload could not be read
    dropped: int = 0  # readings the commit did not take (overload, a store failure)


@dataclass
class _Registration:
    """The state of one registration, which its aiocoap callbacks change."""

    lost: asyncio.Future[str]
    deadline: float = 0.0
    first_taken: bool = False
    early: list[aiocoap.Message] = field(default_factory=list)


class Observation:
    """One observed resource: registers, stores every notification, and re-registers when lost."""

    def __init__(
        self,
        target: ObserveTarget,
        context: aiocoap.Context,
        mapper: Callable[[], Mapper],
        store: Store,
        counters: SourceCounters,
        *,
        margin_s: float,
        backoff_max_s: float,
        max_payload_bytes: int,
    ) -> None:
        self.target = target
        self.context = context
        self._mapper = mapper
        self._store = store
        self.counters = counters
        self.margin_s = margin_s
        self.backoff_max_s = backoff_max_s
        self.max_payload_bytes = max_payload_bytes
        self.stats = ObserveStats()
        self.state = "starting"  # then "observed" or "failed" (retrying)
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._waiting: deque[aiocoap.Message] = deque()  # the one being assembled first, those after it behind
        self._assembler: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"coap-observe {self.target.uri}")

    async def stop(self) -> None:
        """Stop observing; readings already received are still committed."""
        for task in (self._task, self._assembler):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._assembler = None
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def health(self) -> dict[str, Any]:
        return {"uri": self.target.uri, "source": self.target.source, "state": self.state,
                "last_error": self.last_error, **asdict(self.stats)}  # fmt: skip

    async def _run(self) -> None:
        delay = FIRST_BACKOFF_S
        while True:
            if await self._observe() >= self.backoff_max_s:
                delay = FIRST_BACKOFF_S  # it had lasted: come back fast; one that keeps ending backs off
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.backoff_max_s)

    async def _observe(self) -> float:
        """One registration, followed until the observation ends; how long it lasted (0: it did not start)."""
        loop = asyncio.get_running_loop()
        registration = _Registration(loop.create_future())
        # Blocks are fetched here (see the module docstring), never by aiocoap, which sets no bound.
        request = self.context.request(
            aiocoap.Message(code=Code.GET, uri=self.target.uri, observe=0), handle_blockwise=False
        )
        observation = request.observation
        assert observation is not None  # a request with Observe 0 has one
        # Before the first response: a notification that comes in before this task resumes is kept.
        # Callbacks, not `async for`: aiocoap's iterator keeps only the newest of the notifications that
        # arrive between two of its steps, and every one of them is a reading to store.
        observation.register_callback(lambda message: self._notified(registration, message), _suppress_deprecation=True)
        observation.register_errback(lambda error: _settle(registration.lost, _why(error)), _suppress_deprecation=True)
        try:
            try:
                response = await asyncio.wait_for(request.response, REGISTER_TIMEOUT_S)
            except TimeoutError:
                return self._failed(f"no response in {REGISTER_TIMEOUT_S:.0f} s")
            except (aiocoap.error.Error, OSError) as error:
                return self._failed(_why(error))
            if not response.code.is_successful():
                return self._failed(f"answered {response.code.dotted} {response.payload[:100]!r}")
            self._receive(response)
            registration.deadline = loop.time() + self._lifetime(response)
            registration.first_taken = True
            for early in registration.early:
                self._notified(registration, early)
            registration.early.clear()
            if response.opt.observe is None:
                return self._failed("not observable (the answer had no Observe option)")
            self.stats.registrations += 1
            self.state, self.last_error = "observed", ""
            started = loop.time()
            log.info("coap: observing", extra={"uri": self.target.uri, "source": self.target.source})
            reason = await self._follow(registration)
            self.stats.losses += 1
            self.state, self.last_error = "failed", reason
            log.warning("coap: observation lost, registering again", extra={"uri": self.target.uri, "why": reason})
            return loop.time() - started
        finally:
            if not observation.cancelled:
                # aiocoap cannot deregister (RFC 7641 §3.6): the next notification is acknowledged and
                # dropped, the one after answered with a reset, and the sensor forgets the gateway.
                observation.cancel()
            if not request.response.done():
                request.response.cancel()

    async def _follow(self, registration: _Registration) -> str:
        """Wait until the observation ends or falls silent; why it did."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = registration.deadline - loop.time()
            if remaining <= 0:
                return "no notification within Max-Age plus the margin"
            await asyncio.wait({registration.lost}, timeout=remaining)
            if registration.lost.done():
                return registration.lost.result()

    def _failed(self, why: str) -> float:
        self.stats.failures += 1
        if self.state != "failed" or why != self.last_error:
            log.warning("coap: cannot observe", extra={"uri": self.target.uri, "why": why})
        self.state, self.last_error = "failed", why
        return 0.0

    def _lifetime(self, message: aiocoap.Message) -> float:
        max_age = message.opt.max_age
        return (DEFAULT_MAX_AGE_S if max_age is None else max_age) + self.margin_s

    def _notified(self, registration: _Registration, message: aiocoap.Message) -> None:
        if not registration.first_taken:
            registration.early.append(message)
            return
        if not message.code.is_successful():
            _settle(registration.lost, f"ended by the sensor with {message.code.dotted}")
            return
        self.stats.notifications += 1
        registration.deadline = asyncio.get_running_loop().time() + self._lifetime(message)
        self._receive(message)

    def _receive(self, message: aiocoap.Message) -> None:
        """Take a representation now, or after its blocks and those of the notifications before it."""
        block2 = message.opt.block2
        if not self._waiting and (block2 is None or not block2.more):
            self._take(message)
            return
        if len(self._waiting) > MAX_WAITING:
            self._refuse(f"dropped: more than {MAX_WAITING} notifications waited for a block-wise one")
            return
        self._waiting.append(message)
        if self._assembler is None:
            self._assembler = asyncio.get_running_loop().create_task(self._assemble_waiting())

    async def _assemble_waiting(self) -> None:
        try:
            while self._waiting:
                whole = await self._assemble(self._waiting[0])
                self._waiting.popleft()
                if whole is not None:
                    self._take(whole)
        finally:
            self._assembler = None

    async def _assemble(self, first: aiocoap.Message) -> aiocoap.Message | None:
        """The whole representation whose first block is `first`, fetched block by block; None
        (counted as a bad payload) when it is over max_payload_bytes, its blocks do not follow on
        or do not all come within REGISTER_TIMEOUT_S."""
        block2 = first.opt.block2
        if block2 is None or not block2.more:
            return first
        limit = self.max_payload_bytes
        if block2.block_number != 0 or not block2.is_valid_for_payload_size(len(first.payload)):
            return self._refuse("block-wise notification: its first block is not block 0 of its size")
        if (first.opt.size2 or 0) > limit:
            return self._refuse(f"block-wise notification of {first.opt.size2} bytes: over {limit}")
        payload = bytearray(first.payload)
        try:
            async with asyncio.timeout(REGISTER_TIMEOUT_S):
                while block2.more:
                    if len(payload) >= limit:
                        return self._refuse(f"block-wise notification over {limit} bytes")
                    wanted = BlockOption.BlockwiseTuple(len(payload) // block2.size, False, block2.size_exponent)
                    request = aiocoap.Message(code=Code.GET, uri=self.target.uri, block2=wanted)
                    block = await self.context.request(request, handle_blockwise=False).response
                    if not block.code.is_successful():
                        return self._refuse(f"block {wanted.block_number} answered {block.code.dotted}")
                    block2 = block.opt.block2
                    if (
                        block2 is None
                        or block2.start != len(payload)
                        or not block2.is_valid_for_payload_size(len(block.payload))
                        or block.opt.etag != first.opt.etag
                    ):
                        return self._refuse(f"block {wanted.block_number} does not continue the representation")
                    payload += block.payload
        except TimeoutError:
            return self._refuse(f"block-wise notification not fetched in {REGISTER_TIMEOUT_S:.0f} s")
        except (aiocoap.error.Error, OSError) as error:
            return self._refuse(f"block-wise notification: {_why(error)}")
        if len(payload) > limit:
            return self._refuse(f"block-wise notification over {limit} bytes")
        return first.copy(payload=bytes(payload), block2=None)

    def _refuse(self, why: str) -> None:
        self.stats.bad_payloads += 1
        self.counters.add(self.target.uri, why)

    def _take(self, message: aiocoap.Message) -> None:
        """Map one representation and hand its readings to the batcher (without waiting: the next
        notification may come before the commit)."""
        try:
            readings = payload_readings(
                self._mapper(), self.target.source, message.opt.content_format, message.payload, time.time_ns() // 1000
            )
        except Refused as refused:
            self._refuse(f"{refused.code.dotted} {refused}")
            return
        if readings:
            task = asyncio.get_running_loop().create_task(self._commit(readings))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _commit(self, readings: Sequence[Reading]) -> None:
        try:
            await self._store(readings)
        except PayloadError as error:
            self.stats.bad_payloads += 1
            self.counters.add(self.target.uri, str(error))
        except Overloaded as error:
            self.stats.dropped += len(readings)
            self.counters.add(self.target.uri, f"dropped: {error}")
        except Exception as error:  # the batcher logged the store's failure
            self.stats.dropped += len(readings)
            self.counters.add(self.target.uri, f"not stored: {type(error).__name__}")
        else:
            self.stats.readings += len(readings)


def _settle(lost: asyncio.Future[str], why: str) -> None:
    if not lost.done():
        lost.set_result(why)


def _why(error: BaseException) -> str:
    if isinstance(error, aiocoap.error.ObservationCancelled):
        return "the sensor ended the observation"
    if isinstance(error, aiocoap.error.NotObservable):
        return "not observable"
    return f"{type(error).__name__}: {error}"[:300]


class Observer:
    """Every observed resource: those of the config and of the mappings graph, followed."""

    def __init__(
        self,
        client: SepaClient,
        mapper: Callable[[], Mapper],
        store: Store,
        targets: Sequence[ObserveTarget] = (),
        *,
        margin_s: float = 5.0,
        backoff_max_s: float = 30.0,
        max_payload_bytes: int = 65_536,
    ) -> None:
        self.client = client
        self._mapper = mapper
        self._store = store
        self.configured = list(targets)
        self.margin_s = margin_s
        self.backoff_max_s = backoff_max_s
        self.max_payload_bytes = max_payload_bytes
        self.counters = SourceCounters(label="coap: bad notification from")
        self.observations: dict[ObserveTarget, Observation] = {}
        self.retired = ObserveStats()  # the counts of resources no longer observed: the sums never go down
        self.rdf_errors = 0
        self.context: aiocoap.Context | None = None
        self._subscription: ClientSubscription | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Publish the config's targets in the mappings graph, then observe whatever it lists."""
        self.context = await aiocoap.Context.create_client_context(transports=["udp6"], loggername="sepa-coap-observe")
        if self.configured:
            await self.client.update(observe_update(self.configured))
        self._subscription = await self.client.subscribe(OBSERVE_QUERY, "coap-observe", on_notification=self._changed)
        self._sync()

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
        observations, self.observations = list(self.observations.values()), {}
        await asyncio.gather(*(observation.stop() for observation in observations), *self._stopping)
        if self.context is not None:
            await self.context.shutdown()
            self.context = None

    def _changed(self, _notification: Any) -> None:
        if self._subscription is not None:
            self._sync()

    def _sync(self) -> None:
        """Observe the targets the mappings graph lists now, and only those."""
        if self._subscription is None or self.context is None:
            return
        errors: list[ObserveError] = []
        wanted = targets_from_rdf(self._subscription.view.bindings(), errors)
        for error in errors:
            self.rdf_errors += 1
            log.warning("coap: not observed", extra={"error": str(error)})
        for target in wanted:
            if target not in self.observations:
                observation = Observation(
                    target,
                    self.context,
                    self._mapper,
                    self._store,
                    self.counters,
                    margin_s=self.margin_s,
                    backoff_max_s=self.backoff_max_s,
                    max_payload_bytes=self.max_payload_bytes,
                )
                self.observations[target] = observation
                observation.start()
        for target in set(self.observations) - set(wanted):
            retired = self.observations.pop(target)
            _add(self.retired, retired.stats)
            task = asyncio.get_running_loop().create_task(retired.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
            log.info("coap: no longer observed", extra={"uri": target.uri, "source": target.source})

    def health(self) -> dict[str, Any]:
        """`observed` resources (registered now) and `failed` ones (retrying), each one's counters."""
        states = [observation.state for observation in self.observations.values()]
        return {
            "observed": states.count("observed"),
            "failed": states.count("failed"),
            "observations": [observation.health() for observation in self.observations.values()],
        }

    def metrics(self) -> dict[str, int]:
        totals = ObserveStats(**asdict(self.retired))
        for observation in self.observations.values():
            _add(totals, observation.stats)
        health = self.health()
        return {
            "observed": health["observed"],
            "observe_failed": health["failed"],
            **{f"observe_{name}": value for name, value in asdict(totals).items()},
            "observe_rdf_errors": self.rdf_errors,
        }


def _add(totals: ObserveStats, stats: ObserveStats) -> None:
    for name, value in asdict(stats).items():
        setattr(totals, name, getattr(totals, name) + value)
