"""The smart lighting of seed 001 §II-D (Roffia et al. 2016, Fig. 2): event negation with a delayed update.

Three clients over ``smart_lighting.jsap`` (next to this file), as in the paper:

* the **presence sensor**, a :class:`~gateway.client.Producer` of ``REPORT_PRESENCE``, keeps its
  status (true/false) and its timestamp up to date; the timestamp is the engine clock's
  (``fn:nowMicros()``, evaluated by the broker), so every client shares one clock (§II-C);
* the **lamp actuator**, a :class:`~gateway.client.Consumer` of ``LAMP_STATUS`` bound to its lamp,
  records every change of the lamp's status (that is where a real one would drive the relay);
* the **smart-lighting aggregator**, an :class:`~gateway.client.Aggregator` of ``PRESENCE``: a
  presence switches the lamp ON at once (``SWITCH_ON``); an absence schedules ``SWITCH_OFF``, a
  delayed update (the entry's JSAP ``delay``, Δt) whose WHERE clause holds the sensor's status AND
  timestamp as the aggregator saw them.

Why that WHERE clause, and no timer anywhere in the application: it is the paper's event
negation. When the broker runs the delayed update at t + Δt, it matches, and switches the lamp
off, only if the sensor still holds exactly that status and timestamp, i.e. if no presence was
reported within Δt. If somebody came by meanwhile the timestamp changed, the update changes
nothing and the actuator hears nothing. The aggregator never cancels or restarts anything: the
broker keeps the time.

One aggregator serves every lamp-post: ``PRESENCE`` pairs each lamp with its sensor
(``sl:presenceSensor``), so a city's worth of lamps is one subscription (§III, the CTS example).

Why the transport is passed in: as in the chat example, the same agents run over the network
(any broker with delayed updates) and in-process (inside the gateway).

Run it (see README.md here)::

    python -m examples.smart_lighting.smart_lighting --url http://localhost:8000
    python -m examples.smart_lighting.smart_lighting --inprocess --delay 500
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from broker.api import Notification, SepaError, parse_delay
from examples.chat.chat import load_jsap
from gateway.client import Aggregator, Consumer, Producer, Scheduled, SepaClient, SepaClientError, UpdateSummary
from gateway.client.agents import FROM_JSAP, FromJsap, JsapLike
from gateway.client.client import rows_as_bindings
from gateway.client.delays import Delay, delay_param

LIGHTING_JSAP = Path(__file__).with_name("smart_lighting.jsap")
SL = "http://sepa-gateway.example/smart-lighting#"
TRUE_VALUES = ("true", "1")  # xsd:boolean lexical forms of true

Out = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Changes:
    """Lets a caller wait until an agent's state satisfies a condition (re-checked at each change)."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()

    async def signal(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until `condition()` holds (TimeoutError after `timeout` seconds)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(condition), timeout)


class PresenceSensor(Producer):
    """REPORT_PRESENCE for one sensor: status and engine-clock timestamp, replaced at each report."""

    def __init__(self, client: SepaClient, jsap: JsapLike, sensor: str) -> None:
        super().__init__(client, jsap, "REPORT_PRESENCE", bindings={"sensor": sensor})
        self.sensor = sensor

    async def report(self, presence: bool) -> UpdateSummary | Scheduled:
        """Publish a presence (True) or an absence (False); returns after the broker processed it."""
        return await self.produce(presence=presence)


@dataclass(frozen=True)
class LampChange:
    """A change of the lamp's status as the actuator received it (`status` None: the lamp is gone).

    `received` is this client's wall clock, UTC: comparable with a :class:`Scheduled` due time
    when the broker runs on the same host (or has a synchronised clock).
    """

    status: str | None
    sequence: int
    received: datetime


class LampActuator(Consumer):
    """LAMP_STATUS for one lamp: the first result is the initial status, every later one a change."""

    def __init__(
        self, client: SepaClient, jsap: JsapLike, lamp: str, *, on_change: Callable[[LampChange], None] | None = None
    ) -> None:
        super().__init__(client, jsap, "LAMP_STATUS", bindings={"lamp": lamp}, alias=f"lamp-actuator {lamp}")
        self.lamp = lamp
        self.initial: str | None = None
        self.changes: list[LampChange] = []
        self.on_change = on_change
        self.changed = Changes()

    @property
    def status(self) -> str | None:
        """The lamp's status as last notified (``ON``, ``OFF``), None when it has none."""
        return self.changes[-1].status if self.changes else self.initial

    @property
    def statuses(self) -> list[str | None]:
        return [change.status for change in self.changes]

    async def on_notification(self, notification: Notification) -> None:
        added = rows_as_bindings(notification.variables, notification.added)
        status = local_name(added[-1]["status"].value) if added else None
        if notification.sequence == 0:
            self.initial = status
        else:
            change = LampChange(status, notification.sequence, datetime.now(UTC))
            self.changes.append(change)
            if self.on_change is not None:
                self.on_change(change)
        await self.changed.signal()


class SmartLighting(Aggregator):
    """PRESENCE -> SWITCH_ON at once on a presence, SWITCH_OFF delayed by Δt on an absence.

    Every added PRESENCE row is acted on, the first result's included (a sensor that reported an
    absence before the aggregator started still gets its lamp switched off). Removed rows are the
    sensor's previous state and need nothing. `delay` overrides the JSAP's Δt of SWITCH_OFF.
    `scheduled` holds every delayed SWITCH_OFF the broker accepted, in order.
    """

    def __init__(
        self, client: SepaClient, jsap: JsapLike, *, delay: Delay | FromJsap = FROM_JSAP, out: Out = _quiet
    ) -> None:
        super().__init__(client, jsap, "PRESENCE", "SWITCH_OFF", alias="smart-lighting", delay=delay)
        self.switch_on = Producer(client, jsap, "SWITCH_ON", delay=None)
        self.scheduled: list[Scheduled] = []
        self.switched_on = 0
        self.out = out
        self.changed = Changes()

    async def on_notification(self, notification: Notification) -> None:
        for row in rows_as_bindings(notification.variables, notification.added):
            lamp, presence = row["lamp"], row["presence"]
            if presence.value in TRUE_VALUES:
                summary = await self.produce_with(self.switch_on, {"lamp": lamp})
                if summary is not None:
                    self.switched_on += 1
                    done = "stays ON" if isinstance(summary, UpdateSummary) and not summary.added else "ON"
                    sensor = local_name(row["sensor"].value)
                    self.out(f"smart-lighting: presence at {sensor}: {local_name(lamp.value)} {done}")
                continue
            # event negation: SWITCH_OFF matches only if this very status and timestamp are still there
            outcome = await self.produce(lamp=lamp, sensor=row["sensor"], presence=presence, timestamp=row["timestamp"])
            if isinstance(outcome, Scheduled):
                self.scheduled.append(outcome)
                self.out(
                    f"smart-lighting: no presence at {local_name(row['sensor'].value)}, "
                    f"{local_name(lamp.value)} OFF scheduled at {outcome.due:%H:%M:%S.%f} unless somebody comes"
                )
        await self.changed.signal()


def local_name(iri: str) -> str:
    """The part of an IRI after its last # or / (``...#ON`` -> ``ON``)."""
    return iri.rsplit("#", 1)[-1].rsplit("/", 1)[-1]


async def until_run(client: SepaClient, scheduled: Scheduled, timeout: float | None = None) -> None:
    """Wait until the broker no longer lists `scheduled` as pending: it ran (or was cancelled)."""

    async def poll() -> None:
        while any(pending.id == scheduled.id for pending in await client.scheduled()):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def lamp_posts(jsap: JsapLike) -> list[tuple[str, str]]:
    """(lamp, sensor) IRIs of the JSAP's `extended.lampPosts` (one default pair if it has none)."""
    extended = jsap.extended if isinstance(jsap.extended, Mapping) else {}
    posts = [(p["lamp"], p["sensor"]) for p in extended.get("lampPosts", []) if "lamp" in p and "sensor" in p]
    return posts or [(f"{SL}Lamp1", f"{SL}PresenceSensor1")]


async def lamp_status(client: SepaClient, jsap: JsapLike, lamp: str) -> str | None:
    """The lamp's status in the store now (a query, independent of any subscription)."""
    result = await client.query(jsap.query_text("LAMP_STATUS", {"lamp": lamp}))
    statuses = [local_name(row[0].value) for row in result.rows if row[0] is not None]
    return statuses[-1] if statuses else None


def delay_seconds(jsap: JsapLike, delay: Delay | FromJsap = FROM_JSAP) -> float:
    """Δt in seconds: `delay` (as a producer takes it) or else SWITCH_OFF's JSAP delay.

    Raises SepaClientError (invalid_request) for a delay the broker would refuse.
    """
    chosen = jsap.update_delay("SWITCH_OFF") if delay is FROM_JSAP else delay
    return 0.0 if chosen is None else parse_delay(delay_param(chosen)) / 1_000_000


# -- the demo: Fig. 2 ------------------------------------------------------------------------------


async def demonstrate(
    jsap: JsapLike,
    connect: Callable[[], SepaClient],
    *,
    delay: Delay | FromJsap = FROM_JSAP,
    timeout: float = 30.0,
    out: Out = print,
) -> int:
    """Fig. 2: presence, absence, presence again within Δt, absence; 0 if the lamp went ON, then OFF once."""
    lamp, sensor_iri = lamp_posts(jsap)[0]
    delta_s = delay_seconds(jsap, delay)
    started = time.monotonic()

    def say(text: str) -> None:
        out(f"[{time.monotonic() - started:6.2f} s] {text}")

    def print_change(change: LampChange) -> None:
        say(f"lamp-actuator: {local_name(lamp)} is now {change.status}")

    async with connect() as sensor_client, connect() as lamp_client, connect() as lighting_client:
        await Producer(sensor_client, jsap, "INSTALL_LAMP_POST").produce(lamp=lamp, sensor=sensor_iri)
        sensor = PresenceSensor(sensor_client, jsap, sensor_iri)
        actuator = LampActuator(lamp_client, jsap, lamp, on_change=print_change)
        lighting = SmartLighting(lighting_client, jsap, delay=delay, out=say)
        async with actuator, lighting:
            say(f"lamp-actuator: {local_name(lamp)} is {actuator.initial}; Δt = {delta_s:g} s")
            say("presence-sensor: presence")
            await sensor.report(True)
            await actuator.changed.wait_until(lambda: actuator.status == "ON", timeout)
            say("presence-sensor: no presence (t1)")
            await sensor.report(False)
            await lighting.changed.wait_until(lambda: len(lighting.scheduled) >= 1, timeout)
            await asyncio.sleep(delta_s / 2)
            say("presence-sensor: presence again, within Δt")
            await sensor.report(True)
            say("presence-sensor: no presence (t2)")
            await sensor.report(False)
            await lighting.changed.wait_until(lambda: len(lighting.scheduled) >= 2, timeout)
            first, second = lighting.scheduled[:2]
            await until_run(lighting_client, first, timeout + delta_s)
            still = await lamp_status(lighting_client, jsap, lamp)
            say(f"broker: the first delayed OFF ran, {local_name(lamp)} is still {still} (a presence within Δt)")
            await actuator.changed.wait_until(lambda: actuator.status == "OFF", timeout + 2 * delta_s)
        await Producer(sensor_client, jsap, "REMOVE_LAMP_POST").produce(lamp=lamp)
    ok = still == "ON" and actuator.statuses == ["ON", "OFF"]
    say(f"the lamp actuator saw {' -> '.join(map(str, actuator.statuses))}: OFF only Δt after the last presence")
    return 0 if ok and lighting.failures == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m examples.smart_lighting.smart_lighting``: Fig. 2 of seed 001; exit 0 if it went as drawn."""
    parser = argparse.ArgumentParser(prog="python -m examples.smart_lighting.smart_lighting", description=main.__doc__)
    parser.add_argument("--jsap", default=str(LIGHTING_JSAP), metavar="FILE", help="the profile (smart_lighting.jsap)")
    parser.add_argument("--url", help="the broker, http://host:port (default: the JSAP's, http://localhost:8000)")
    parser.add_argument("--ws-url", help="the subscribe WebSocket (default: ws://HOST:9000/subscribe with --url)")
    parser.add_argument("--inprocess", action="store_true", help="run a broker engine in this process instead")
    parser.add_argument(
        "--delay", metavar="DT", help="Δt of the delayed OFF: milliseconds or ISO 8601 (default: the JSAP's, PT2S)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each step (default 30)")
    args = parser.parse_args(argv)
    try:
        jsap = load_jsap(args.jsap, args.url, args.ws_url)
        delay: Delay | FromJsap = FROM_JSAP if args.delay is None else args.delay
        delay_seconds(jsap, delay)  # a bad --delay is reported now, not by the first absence
    except (OSError, ValueError, SepaError, SepaClientError) as error:  # JsapError is a ValueError
        print(f"smart_lighting: {error}", file=sys.stderr)
        return 1

    async def run() -> int:
        if not args.inprocess:
            from gateway.client import client_for

            return await demonstrate(jsap, lambda: client_for(jsap), delay=delay, timeout=args.timeout)
        from broker.api import Engine, Scheduler
        from gateway.client import InProcessTransport

        scheduler = Scheduler(Engine())
        try:
            connect = lambda: SepaClient(InProcessTransport(scheduler))  # noqa: E731
            return await demonstrate(jsap, connect, delay=delay, timeout=args.timeout)
        finally:
            await scheduler.delayed.stop()
            await asyncio.to_thread(scheduler.close)

    try:
        return asyncio.run(run())
    except SepaClientError as error:
        print(f"smart_lighting: {' '.join(error.error_description.split())}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"smart_lighting: the lamp did not behave as in Fig. 2 within {args.timeout} s", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
