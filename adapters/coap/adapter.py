"""The CoAP adapter: readings in from constrained sensors (aiocoap server, UDP), the resources it
observes (observer.py) and commands out (actuators.py).

A client of the broker like the MQTT adapter (docs/adapters.md): readings go through the shared
observation writer, mappings come from the config, the mappings graph (followed: a SPARQL update
adds one without a restart) and the CoAP profiles (`/s/{sensor}/{property}`, `/s/{device}`).
Named subscriptions are observable resources under `/q` (:mod:`adapters.coap.queries`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiocoap
from aiocoap import Code

from adapters.coap import deliveries, tokens
from adapters.coap.access import Access
from adapters.coap.actuators import CoapActuator, CoapActuators
from adapters.coap.batcher import Batcher
from adapters.coap.credentials import OSCORE_REFUSALS, SensorCredentials
from adapters.coap.errors import Refused
from adapters.coap.fastpath import FastPath
from adapters.coap.observer import Observer, ObserveTarget
from adapters.coap.profiles import default_profiles
from adapters.coap.queries import QueriesResource, QueryLimits
from adapters.coap.readings import ReadingsResource
from adapters.coap.site import GatewaySite
from gateway.client import ClientSubscription, SepaClient
from gateway.observations import MAPPINGS_QUERY, Mapper, Mapping, MappingError, mappings_from_rdf, mappings_update
from gateway.observations.writer import ObservationWriter

log = logging.getLogger(__name__)

# aiocoap's loggers besides the context's own ("sepa-coap"): its OSCORE wrapper's, and the server's
# parent. A logger's filter sees only what is logged to that logger, not to its children.
AIOCOAP_LOGGERS = ("coap-server", "coap-server.oscore-site")
TOKEN_IN_USE = "(token in use)"  # the resource a request refused for its token is counted under


class CoapAdapter:
    """Serves the gateway's CoAP resources on `host`:`port` (UDP)."""

    def __init__(
        self,
        client: SepaClient,
        writer: ObservationWriter,
        *,
        host: str = "::",
        port: int = 5683,
        mappings: Sequence[Mapping] = (),
        secure: bool = False,
        max_payload_bytes: int = 65_536,
        batch_max: int = 500,
        network_requests_max: int = 20_000,
        reserve_per_sensor: int = 1_000,
        oscore_dir: Path | None = None,
        peer_client: SepaClient | None = None,
        subscriptions: Sequence[tuple[str, str]] = (),
        query_limits: QueryLimits | None = None,
        observe: Sequence[ObserveTarget] = (),
        observe_margin_s: float = 5.0,
        observe_backoff_max_s: float = 30.0,
        actuators: Sequence[CoapActuator] = (),
    ) -> None:
        self.client = client
        self.writer = writer
        self.host = "::" if host == "0.0.0.0" else host  # aiocoap's udp6 transport: :: takes IPv4 too
        self.port = port
        self.configured = list(mappings)
        self.profiles = default_profiles()
        self.mapper = Mapper([*self.configured, *self.profiles], max_payload_bytes=max_payload_bytes)
        self.batcher = Batcher(writer, batch_max=batch_max)
        self.oscore = SensorCredentials(oscore_dir) if oscore_dir is not None else None
        access = Access(secure=secure, may_post=self.oscore.may_post if self.oscore is not None else None)
        self.readings = ReadingsResource(lambda: self.mapper, self.batcher, access, max_payload_bytes=max_payload_bytes)
        self.queries = QueriesResource(
            client,
            access,
            configured=subscriptions,
            limits=query_limits,
            context=lambda: self.context,
            peer_client=peer_client,
            counters=self.readings.counters,
        )
        self.site = GatewaySite(self.readings, self.queries)
        self.fast = FastPath(
            self.readings,
            self.site,
            secure=secure,
            network_requests_max=network_requests_max,
            reserve_per_sensor=reserve_per_sensor,
            sensor_kids=(lambda: self.oscore.kids) if self.oscore is not None else frozenset,
        )
        self.observer = Observer(
            client,
            lambda: self.mapper,
            self.batcher.store,
            observe,
            margin_s=observe_margin_s,
            backoff_max_s=observe_backoff_max_s,
            max_payload_bytes=max_payload_bytes,
        )
        self.actuators = CoapActuators(client, actuators)
        self.mapping_errors = 0
        self.context: aiocoap.Context | None = None
        self._mappings: ClientSubscription | None = None

    async def start(self) -> None:
        """Publish the config's mappings, follow the mappings graph, then listen."""
        if self.configured:
            await self.client.update(mappings_update(self.configured))
        self._mappings = await self.client.subscribe(
            MAPPINGS_QUERY, "coap-mappings", on_notification=self._mappings_changed
        )
        self._rebuild()
        await self.writer.load()
        recorded = await self.client.query(deliveries.QUERY)
        self.batcher.deliveries.load(dict(zip(recorded.variables, row, strict=True)) for row in recorded.rows)
        await self.queries.start()
        self.batcher.start()
        root: Any = self.site
        credentials = None
        if self.oscore is not None:
            root, credentials = self.oscore.wrap(self.site), self.oscore.map
        try:
            self.context = await aiocoap.Context.create_server_context(
                root,
                bind=(self.host, self.port),
                transports=["udp6"],
                loggername="sepa-coap",
                server_credentials=credentials,
            )
        except OSError as error:
            await self.batcher.stop()
            await self.queries.stop()
            raise OSError(f"cannot listen on [{self.host}]:{self.port}/udp: {error.strerror or error}") from None
        self.fast.attach(self.context)
        tokens.attach(self.context, self._token_in_use)
        for logger in self._aiocoap_loggers():
            logger.addFilter(self.fast.quiet)
        await self.observer.start()
        await self.actuators.start()
        if self.oscore is not None:
            self.oscore.start()
        log.info(
            "coap adapter listening",
            extra={
                "address": f"[{self.host}]:{self.bound_port}/udp",
                "oscore_sensors": self.oscore.count if self.oscore else 0,
            },
        )
        if not self.readings.access.secure and self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "INSECURE: CoAP readings and subscriptions are open to the network, unauthenticated; enable [security]",
                extra={"host": self.host},
            )

    async def stop(self) -> None:
        """End the observations, stop listening, commit what was received, stop following the mappings."""
        await self.queries.stop()
        if self.oscore is not None:
            await self.oscore.stop()
        await self.actuators.stop()
        await self.observer.stop()
        if self.context is not None:
            await self.context.shutdown()
            for logger in self._aiocoap_loggers():
                logger.removeFilter(self.fast.quiet)
            self.context = None
        await self.batcher.stop()
        if self._mappings is not None:
            await self._mappings.unsubscribe()
            self._mappings = None

    def _aiocoap_loggers(self) -> list[logging.Logger]:
        """The loggers aiocoap notes each datagram's fate on, for `FastPath.quiet`: the context's, and
        the OSCORE wrapper's. Why the wrapper's: it logs a renderable error (2.31 Continue) at INFO for
        each block of an OSCORE sensor's block-wise request; with only the context's logger filtered,
        300 blocks were 300 lines (65 KB), and 16-byte blocks ~21,000 lines in 247 s."""
        assert self.context is not None
        return [self.context.log, *(logging.getLogger(name) for name in AIOCOAP_LOGGERS)]

    def _token_in_use(self, _request: aiocoap.Message) -> None:
        """Count a request refused for the token of another under way (:mod:`adapters.coap.tokens`)
        with the readings' refusals, under one name: the peer's paths are its own to make up."""
        self.readings.refuse(TOKEN_IN_USE, Refused(Code.BAD_REQUEST, tokens.IN_USE))

    def _mappings_changed(self, _notification: Any) -> None:
        if self._mappings is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        rows = self._mappings.view.bindings() if self._mappings is not None else []
        errors: list[MappingError] = []
        stored = mappings_from_rdf(rows, errors)
        self.mapping_errors += len(errors)
        try:
            self.mapper = self.mapper.rebuild([*stored, *self.profiles])
        except MappingError as error:
            self.mapping_errors += 1
            log.warning("coap: mappings not changed", extra={"error": str(error)})

    @property
    def bound_port(self) -> int:
        """The UDP port really bound: the configured one, or the one the system chose for 0."""
        if self.context is None:
            return self.port
        for interface in self.context.request_interfaces:
            transport = getattr(interface.token_interface.message_interface, "transport", None)
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:
                return int(sock.getsockname()[1])
        return self.port

    def urls(self) -> list[str]:
        shown = "localhost" if self.host in ("::", "0.0.0.0") else f"[{self.host}]" if ":" in self.host else self.host
        return [f"coap://{shown}:{self.bound_port}/"]

    def health(self) -> dict[str, Any]:
        listening = self.context is not None
        return {"ok": listening, "listening": listening, **self.observer.health(), **self.actuators.health()}

    def metrics(self) -> dict[str, Any]:
        resource = self.readings
        return {
            "requests": resource.requests,
            "readings": resource.readings,
            "bad_input": resource.counters.total,
            "bad_input_by_resource": dict(resource.counters.counts),
            **{f"refused_{code.replace('.', '_')}": count for code, count in sorted(resource.refused.items())},
            "mapping_errors": self.mapping_errors,
            "batches": self.batcher.stats.batches,
            "largest_batch": self.batcher.stats.largest_batch,
            "commit_failures": self.batcher.stats.commit_failures,
            "duplicates_skipped": self.batcher.deliveries.duplicates,
            "oscore_sensors": self.oscore.count if self.oscore is not None else 0,
            "oscore_malformed": self.oscore.malformed if self.oscore is not None else 0,
            **{
                f"oscore_refused_{reason}": self.oscore.refused[reason] if self.oscore is not None else 0
                for reason in OSCORE_REFUSALS
            },
            "oscore_ended_while_responding": self.oscore.ended_while_responding if self.oscore is not None else 0,
            "oscore_ended_released": self.oscore.ended_released if self.oscore is not None else 0,
            **self.fast.metrics(),
            **self.queries.metrics(),
            **self.observer.metrics(),
            **self.actuators.metrics(),
        }
