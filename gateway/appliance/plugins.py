"""Adapters as plug-ins: the one interface the appliance knows an adapter by, and how it finds them.

Why plug-ins: an adapter (MQTT today, CoAP next) is a client of the broker like any application
(docs/architecture.md), and the appliance only has to start it, stop it, ask how it is and count
what it did. So the appliance iterates :class:`Adapter` objects built by :class:`AdapterPlugin`
objects that it finds through the ``sepa_gateway.adapters`` entry point group (pyproject.toml),
never by importing adapters/: adding an adapter is a package and one entry point line
(docs/adapters.md), and the appliance's code does not change.

Each plug-in owns one section of the TOML file, ``[name]``: a dataclass of settings with their
documented defaults (``enabled`` among them), parsed and type-checked by the appliance like its own
sections (:mod:`gateway.appliance.config`), checked by the plug-in when the configuration is
validated (so a bad section is one line at start-up), and handed to :meth:`AdapterPlugin.build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gateway.client import SepaClient
    from gateway.observations.writer import ObservationWriter

ENTRY_POINTS = "sepa_gateway.adapters"


@runtime_checkable
class Adapter(Protocol):
    """A running adapter, as the appliance drives it."""

    async def start(self) -> None:
        """Connect and begin work; returns once started (a peer that is down is retried, not fatal)."""

    async def stop(self) -> None:
        """Stop taking input, finish or hand back what is in flight, release every resource."""

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, ...}``: whether the adapter does its job now, and why not (for /health)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """Counters and state, flat JSON values (for /metrics, under the plug-in's name)."""
        ...

    # Optional: `def urls(self) -> list[str]`, what a listening adapter serves once started (the
    # "sepa-gateway serving" log line shows them; coap://host:port/ with the port really bound).


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """What the appliance gives every adapter it builds."""

    client: SepaClient  # an in-process client of the broker (the same API as a network client)
    gateway_id: str  # names this gateway in observation IRIs
    data_dir: str  # the store's data directory ("" for a store in memory): where to keep state
    observations: ObservationWriter  # the one writer of readings, shared by every adapter (its docstring says why)
    secure: bool = False  # [security] enabled (the installed service): authenticate every peer on the network
    # an in-process client limited like a network client (time limits, probed subscriptions): for
    # what a peer asks the adapter to run (a CoAP POST /q), never for the adapter's own requests
    peer_client: SepaClient | None = None


class AdapterPlugin(Protocol):
    """What an entry point of the ``sepa_gateway.adapters`` group names."""

    name: str  # the TOML section, [name], and the key of its metrics
    section: type  # a dataclass: the section's settings and their defaults, with `enabled: bool`

    def check(self, section: Any) -> None:
        """Raise gateway.appliance.config.ConfigError naming what is wrong in the section, enabled or
        not (a bad value in a section turned off must not wait for the day it is turned on)."""

    def build(self, section: Any, context: AdapterContext) -> Adapter:
        """The adapter for an enabled, checked section (not started)."""
        ...


@cache
def adapter_plugins() -> dict[str, AdapterPlugin]:
    """Every installed adapter plug-in by name (entry points are read once per process)."""
    found: dict[str, AdapterPlugin] = {}
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda point: point.name):
        plugin = point.load()
        if plugin.name in found:
            raise RuntimeError(f"two adapter plug-ins are named {plugin.name!r}")
        found[plugin.name] = plugin
    return found
