"""Garbage-collector settings for a long-running gateway process.

Why: every update allocates several short-lived tuples per quad (terms, rows, deltas), so with
CPython's default gen0 threshold (700 allocations) the cyclic collector runs many times per
update, and its older generations walk every long-lived object (ontologies, parse caches, the
LUTT, subscriptions). Almost nothing the gateway allocates is cyclic garbage (reference counting
frees it), so collections find little. Measured on the MQTT benchmark's gateway: 8-10 % less CPU
per reading with a gen0 threshold of 50,000 (`sepa-gateway bench shipper`, alternating runs).

The start-up objects (modules, ontologies, the engine's long-lived caches) are frozen, moved out
of the collector's generations, once the gateway serves: they live as long as the gateway, and a
full collection no longer walks them while holding the GIL (measured in the MQTT benchmark: full
collections of 100-190 ms every ~2 s were the whole p99 tail of the notification latency; the lru
caches alone cost ~30 ms a walk when full). Garbage is collected first, so that no cycle is frozen
in. The young generation stays bounded (at most 50,000 tracked objects, a few MB), which a
Raspberry Pi can afford.
"""

from __future__ import annotations

import gc

DEFAULT_THRESHOLDS = (700, 10, 10)
GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100


def settle_after_start() -> None:
    """Collect once, freeze what start-up built, and raise the thresholds (call once, when serving)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def release_after_stop() -> None:
    """Hand the frozen objects back and restore CPython's default thresholds (a stopped gateway may
    share its process with others: tests, embedding applications)."""
    gc.unfreeze()
    gc.set_threshold(*DEFAULT_THRESHOLDS)
