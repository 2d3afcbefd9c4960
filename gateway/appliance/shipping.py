"""The `[shipper]` section turned into the cloud shipper (the appliance wires it; the shipper knows no TOML)."""

from __future__ import annotations

from pathlib import Path

from gateway.appliance.config import Config, ConfigError
from gateway.client import SepaClient
from gateway.shipper.shipper import Shipper, ShipperSettings


def build_shipper(config: Config, client: SepaClient, gateway_id: str) -> Shipper:
    section = config.shipper
    if not (section.spool_dir or config.store.data_dir):
        raise ConfigError("shipper.spool_dir is required when the store is in memory (no --data-dir)")
    spool_dir = Path(section.spool_dir) if section.spool_dir else Path(config.store.data_dir) / "spool"
    settings = ShipperSettings(
        url=section.url,
        token=section.token(),
        spool_dir=spool_dir,
        ca_file=section.ca_file or None,
        segment_max_bytes=section.segment_max_bytes,
        segment_max_age_s=section.segment_max_age_s,
        budget_bytes=section.spool_budget_bytes,
        upload_timeout_s=section.upload_timeout_s,
        backoff_initial_s=section.backoff_initial_s,
        backoff_max_s=section.backoff_max_s,
        uploads_in_flight=section.uploads_in_flight,
    )
    return Shipper(client, settings, gateway_id)
