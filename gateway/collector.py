"""Garbage-collector settings for a long-running gateway process.

Why: every update allocates several short-lived tuples per quad (terms, rows, deltas), so with
CPython's default gen0 threshold (700 allocations) the cyclic collector runs many times per
update, and its older generations walk every long-lived object (ontologies, parse caches, the
LUTT, subscriptions). Almost nothing the gateway allocates is cyclic garbage (reference counting
frees it), so collections find little. Measured on the MQTT benchmark's gateway: 8-10 % less CPU
per reading with a gen0 threshold of 50,000 (`sepa-gateway bench shipper`, alternating runs).

The start-up objects are frozen (moved out of the collector's generations) once the gateway
serves: they live as long as the process. The young generation stays bounded (at most 50,000
tracked objects, a few MB), which a Raspberry Pi can afford.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100


def settle_after_start() -> None:
    """Collect once, freeze what start-up built, and raise the thresholds (call once, when serving)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
