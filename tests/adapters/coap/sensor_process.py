"""A CoAP sensor and actuator for the tests, run as its own process (a real peer over UDP).

    python -m tests.adapters.coap.sensor_process --port 0 --max-age 1 --observable temperature --actuator lamp

It serves on 127.0.0.1: each `--observable NAME` is an observable resource `/NAME` (RFC 7641) whose
notifications carry Max-Age `--max-age` and are sent again before it expires (as RFC 7641 §4.3.1
asks, to keep the observers' copy fresh), `--initial NAME=TEXT` its first value (text/plain); each
`--actuator NAME` is a resource `/NAME` that takes PUT and POST. A separate process so that a test
can kill it and start it again on the same port: a sensor that restarted and forgot its observers,
as a real one does.

Driven through its standard streams, one line each:
- stdout `ready PORT` once it listens; `put NAME CONTENT_FORMAT PAYLOAD_HEX` for every PUT or POST
  received (answered 2.04); `observers NAME COUNT` when a resource's observer count changes.
- stdin `set NAME CONTENT_FORMAT PAYLOAD_HEX` changes a resource's representation and notifies its
  observers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable

import aiocoap
from aiocoap import Code
from aiocoap.resource import ObservableResource, Resource, Site


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Observable(ObservableResource):
    """A representation set from stdin; observers are notified of every change."""

    def __init__(self, name: str, max_age: int) -> None:
        super().__init__()
        self.name = name
        self.max_age = max_age
        self.payload = b""
        self.content_format: int | None = None

    def set(self, content_format: int, payload: bytes) -> None:
        self.content_format, self.payload = content_format, payload
        self.updated_state()

    def update_observation_count(self, newcount: int) -> None:
        say(f"observers {self.name} {newcount}")

    async def render_get(self, request: aiocoap.Message) -> aiocoap.Message:
        if self.content_format is None:
            return aiocoap.Message(code=Code.SERVICE_UNAVAILABLE, max_age=self.max_age)
        return aiocoap.Message(payload=self.payload, content_format=self.content_format, max_age=self.max_age)


class Actuator(Resource):
    """Records every command it receives on stdout."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    async def render_put(self, request: aiocoap.Message) -> aiocoap.Message:
        content_format = request.opt.content_format
        say(f"put {self.name} {-1 if content_format is None else int(content_format)} {request.payload.hex()}")
        return aiocoap.Message(code=Code.CHANGED)

    render_post = render_put


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-age", type=int, default=60)
    parser.add_argument("--observable", action="append", default=[])
    parser.add_argument("--initial", action="append", default=[])
    parser.add_argument("--actuator", action="append", default=[])
    options = parser.parse_args()
    site = Site()
    observables = {name: Observable(name, options.max_age) for name in options.observable}
    for initial in options.initial:
        name, _, text = initial.partition("=")
        observables[name].content_format, observables[name].payload = 0, text.encode()
    for name, resource in observables.items():
        site.add_resource([name], resource)
    for name in options.actuator:
        site.add_resource([name], Actuator(name))
    context = await aiocoap.Context.create_server_context(site, bind=("127.0.0.1", options.port), transports=["udp6"])
    port = options.port
    for interface in context.request_interfaces:
        transport = getattr(interface.token_interface.message_interface, "transport", None)
        if transport is not None:
            port = transport.get_extra_info("socket").getsockname()[1]
    refresh = asyncio.get_running_loop().create_task(keep_fresh(observables.values(), options.max_age))
    say(f"ready {port}")
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command, name, content_format, payload = line.decode().split()
        if command == "set":
            observables[name].set(int(content_format), bytes.fromhex(payload))
    refresh.cancel()
    await context.shutdown()


async def keep_fresh(observables: Iterable[Observable], max_age: int) -> None:
    """Notify every observer again before the last notification's Max-Age runs out."""
    while True:
        await asyncio.sleep(max_age * 0.6)
        for resource in observables:
            if resource.content_format is not None:
                resource.updated_state()


if __name__ == "__main__":
    asyncio.run(main())
