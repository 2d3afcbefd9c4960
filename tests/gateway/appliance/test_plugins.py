"""Adapters are plug-ins (gateway/appliance/plugins.py): the appliance runs whatever it finds.

What it protects: an adapter the appliance has never heard of (no import of it anywhere in
gateway/) gets its own TOML section with typed defaults and checks, is built, started before the
gateway serves, shown on /metrics under its name, asked for its health, and stopped on shutdown;
a disabled one is never built; the built-in MQTT adapter is found the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gateway.appliance.app as app_module
import gateway.appliance.config as config_module
from gateway.appliance.config import Config, ConfigError, load_config
from gateway.appliance.plugins import AdapterContext, adapter_plugins
from tools.launcher import InProcessGateway, start_in_process


@dataclass
class BellSettings:
    enabled: bool = True
    greeting: str = "ding"


class Bell:
    def __init__(self, settings: BellSettings, events: list[str]) -> None:
        self.settings, self.events, self.rung = settings, events, 0

    async def start(self) -> None:
        self.events.append(f"start {self.settings.greeting}")

    async def stop(self) -> None:
        self.events.append("stop")

    def health(self) -> dict[str, Any]:
        return {"ok": True, "rung": self.rung}

    def metrics(self) -> dict[str, Any]:
        return {"rung": 7}


class BellPlugin:
    name = "bell"
    section = BellSettings

    def __init__(self) -> None:
        self.events: list[str] = []
        self.contexts: list[AdapterContext] = []

    def check(self, section: BellSettings) -> None:
        if not section.greeting:
            raise ConfigError("bell.greeting cannot be empty")

    def build(self, section: BellSettings, context: AdapterContext) -> Bell:
        self.contexts.append(context)
        return Bell(section, self.events)


@pytest.fixture
def bell(monkeypatch: pytest.MonkeyPatch) -> BellPlugin:
    plugin = BellPlugin()
    for module in (app_module, config_module):
        monkeypatch.setattr(module, "adapter_plugins", lambda: {"bell": plugin})
    return plugin


def test_the_mqtt_adapter_is_an_installed_plug_in() -> None:
    assert "mqtt" in adapter_plugins()
    assert Config().adapter("mqtt").enabled


def test_a_plug_in_owns_a_typed_section_of_the_toml_file(bell: BellPlugin, tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[bell]\ngreeting = "dong"\n', encoding="utf-8")
    assert load_config(path).adapter("bell").greeting == "dong"
    for text, message in (
        ("[bell]\nvolume = 3\n", "unknown setting bell.volume"),
        ("[bell]\ngreeting = 3\n", "bell.greeting must be a str"),
        ('[bell]\ngreeting = ""\n', "bell.greeting cannot be empty"),
    ):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=message):
            load_config(path)


def test_the_appliance_builds_starts_shows_and_stops_every_enabled_plug_in(bell: BellPlugin) -> None:
    running, thread = start_in_process(Config())
    try:
        assert bell.events == ["start ding"]
        assert bell.contexts[0].client is running.gateway.client  # the in-process client of the broker
        assert running.metrics()["sepa_bell_rung"] == 7
        assert running.gateway.health() == {"bell": {"ok": True, "rung": 0}}
    finally:
        running.call(running.gateway.stop())
        running.loop.call_soon_threadsafe(running.loop.stop)
        thread.join(10)
        running.loop.close()
    assert bell.events == ["start ding", "stop"]


def test_a_disabled_plug_in_is_never_built(bell: BellPlugin, in_process_gateway: Any) -> None:
    config = Config()
    config.adapter("bell").enabled = False
    running: InProcessGateway = in_process_gateway(config)
    assert bell.contexts == [] and running.gateway.health() == {}
