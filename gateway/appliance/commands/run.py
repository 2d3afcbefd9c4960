"""`sepa-gateway run`: serve the SEPA broker on its embedded defaults or a TOML config."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from broker.api import StoreFailed
from gateway.appliance.allocator import limit_malloc_arenas
from gateway.appliance.app import STOP_SIGNALS, Gateway, StartupError
from gateway.appliance.config import ConfigError, coap_host_of, load_config
from gateway.appliance.logs import setup_logging


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", description="Run the gateway (HTTP + WebSocket gates).")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration (see systemd/sepa-gateway.toml)")
    parser.add_argument("--data-dir", metavar="DIR", help="on-disk store directory (default: in-memory store)")
    parser.add_argument(
        "--host", help="listen address of the plain gates and CoAP (default 0.0.0.0, with [security] 127.0.0.1)"
    )
    parser.add_argument("--http-port", type=int, help="SPARQL 1.1 Protocol port (default 8000)")
    parser.add_argument("--ws-port", type=int, help="subscription WebSocket port (default 9000)")
    parser.add_argument("--https-port", type=int, help="secure HTTPS port, with [security] enabled (default 8443)")
    parser.add_argument("--wss-port", type=int, help="secure WebSocket port, with [security] enabled (default 9443)")
    parser.add_argument("--secure", action="store_true", help="enable the secure gates ([security] enabled)")
    parser.add_argument("--no-mqtt", action="store_true", help="serve without the MQTT adapter ([mqtt] enabled)")
    parser.add_argument("--coap-port", type=int, help="CoAP UDP port, 0 for any free one (default 5683)")
    parser.add_argument("--no-coap", action="store_true", help="serve without the CoAP adapter ([coap] enabled)")
    parser.add_argument(
        "--log-file", metavar="FILE", help="log to FILE, rotated ([logging] file; stderr under systemd's journal)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    limit_malloc_arenas()  # before any thread: see gateway.appliance.allocator
    try:
        config = load_config(args.config, secure=args.secure)
        if args.data_dir is not None:
            config.store.data_dir = args.data_dir
        if args.host is not None:
            config.http.host = args.host
            if "coap" in config.adapters:  # the CoAP adapter listens where the gateway does
                config.adapter("coap").host = coap_host_of(args.host)
        if args.http_port is not None:
            config.http.port = args.http_port
        if args.ws_port is not None:
            config.websocket.port = args.ws_port
        if args.https_port is not None:
            config.security.https_port = args.https_port
        if args.wss_port is not None:
            config.security.wss_port = args.wss_port
        if args.no_mqtt:
            config.adapter("mqtt").enabled = False
        if args.coap_port is not None:
            config.adapter("coap").port = args.coap_port
        if args.no_coap:
            config.adapter("coap").enabled = False
        if args.log_file is not None:
            config.logging.file = args.log_file
        config.validate()
    except ConfigError as error:
        print(f"sepa-gateway: bad configuration: {error}", file=sys.stderr)
        return 2
    settings = config.logging
    try:
        setup_logging(settings.level, settings.file, settings.file_max_bytes, settings.file_backups)
    except OSError as error:
        print(f"sepa-gateway: cannot open the log file {settings.file}: {error.strerror or error}", file=sys.stderr)
        return 2
    try:
        gateway = _build(config)
        _serve(gateway)
    except StartupError as error:
        print(f"sepa-gateway: {error}", file=sys.stderr)
        return error.exit_status
    if gateway.scheduler.queries_running:
        # stopped cleanly (store flushed, sockets closed), but a query thread is blocked in pyoxigraph
        # on a SERVICE endpoint that never answered: the interpreter would wait for it forever
        logging.getLogger("sepa_gateway").warning(
            "exiting without waiting for a blocked query", extra={"threads": gateway.scheduler.queries_running}
        )
    else:
        for thread in threading.enumerate():  # as the interpreter's exit would (none is left after a stop)
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    _leave(gateway.exit_status)


def _serve(gateway: Gateway) -> None:
    """asyncio.run(gateway.serve()), but the loop's signal handlers are replaced by _stopped's and
    never reset to the default action: the process ends with _leave, so the loop is not closed.

    Why: asyncio.run's close of the loop gave the stop signals back their default action, which kills
    (exit 143), until run installed _stopped's after it returned. A second SIGTERM sent as the line
    "sepa-gateway stopped" was read fell in between once in a full run of the suite (2026-12-07, test_run.py
    test_a_second_sigterm_after_the_stop_still_exits_0); a flood of SIGTERMs from that line on hit
    it in 1 of 3 runs (test_a_flood_of_stop_signals_after_the_stop_still_exits_0), never since."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(gateway.serve())
    except BaseException:
        loop.close()
        raise
    for signum in STOP_SIGNALS:  # handler for handler: the default action is never in between
        signal.signal(signum, _stopped(gateway.exit_status))
    leftover = asyncio.all_tasks(loop)  # what asyncio.run does before it closes the loop
    for task in leftover:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


def _leave(status: int) -> NoReturn:
    """End the process once the gateway has stopped, without the interpreter's finalization.

    Why: everything durable is done by then (updates answered, journal flushed and emptied, RocksDB
    flushed or the snapshot written, worker and journal-sync processes killed and reaped, sockets
    closed, the temporary security directory removed: Gateway.stop), and what the interpreter still
    did was to free the heap after "sepa-gateway stopped": its final garbage collections walked every
    object the stop had unfrozen (gateway.appliance.collector), then the in-memory store was dropped
    quad by quad. 200,000 quads in memory, SIGTERM, 6 pairs alternated with the build before at load
    8-14 (2026-12-07): 0.58-1.94 s of wall after that line, now 0.04-0.10 s; in 3 of the pairs,
    0.60-0.78 CPU-s (of the process and its reaped children, from /proc and wait4), now 0.04-0.06;
    an empty store, 0.40 CPU-s, now 0.03.
    py-spy record of the exit, 2026-12-07: 208 of 250 main-thread samples in gc_collect_main on an
    empty store; with 200,000 quads 540 in gc_collect_main and ~130 dropping pyoxigraph's memory
    store (tools.launcher's gateway, loaded by INSERT DATA, SIGTERM, `py-spy record --native -r 250`).
    What of the interpreter's exit still matters is done here or before (run waits for the threads
    that are not daemons, as it did): the logs and the standard streams are flushed. No child
    process is left: no worker runs under multiprocessing, whose exit handler this skips."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _build(config):  # type: ignore[no-untyped-def]
    try:
        return Gateway(config)
    except ConfigError as error:  # what only the whole configuration, options included, can tell
        raise StartupError(f"bad configuration: {error}") from error
    except (OSError, StoreFailed) as error:
        raise StartupError(f"cannot open the data directory {config.store.data_dir}: {error}") from error


def _stopped(status: int) -> Callable[[int, FrameType | None], None]:
    """What a stop signal does once the gateway has stopped (store closed, sockets closed): exit
    now with the stop's status. Why: a second SIGTERM or Ctrl-C while the process ended (then the
    interpreter's exit, ~2.5 s; now run's wait for threads and the logs' flush, see _leave) killed
    it, exit 143 instead of 0 (SIGTERM twice 0.5 s apart, 2026-12-07)."""

    def leave(_signum: int, _frame: FrameType | None) -> None:
        _leave(status)

    return leave
