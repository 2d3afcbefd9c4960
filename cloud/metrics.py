"""Counters of the landing endpoint, rendered as Prometheus text on ``GET /metrics``.

Why counters only: an operator needs to see that batches arrive, how many were retries, and above
all why uploads are refused (a shipper bug shows up as ``bad_record``, a wrong token as
``unauthorized``) without reading logs; rates come from Prometheus.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class LandingMetrics:
    """What the endpoint did since it started. Only the event loop thread updates it."""

    batches_stored: int = 0
    batches_duplicate: int = 0
    records_stored: int = 0
    bytes_stored: int = 0
    bytes_received: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    # cloud.guards: connections_refused, timeout_head, timeout_body
    guards: Counter[str] = field(default_factory=Counter)

    def render(self) -> str:
        """Prometheus text exposition format 0.0.4."""
        lines: list[str] = []
        _counter(lines, "batches_stored", "Batches written to the landing directory.", self.batches_stored)
        _counter(lines, "batches_duplicate", "Re-uploads of a stored batch, same bytes.", self.batches_duplicate)
        _counter(lines, "records_stored", "Observation records in the stored batches.", self.records_stored)
        _counter(lines, "bytes_stored", "Compressed bytes written to the landing directory.", self.bytes_stored)
        _counter(lines, "bytes_received", "Compressed batch bytes received, accepted or not.", self.bytes_received)
        lines.append("# HELP sepa_cloud_batches_rejected_total Uploads refused, by reason.")
        lines.append("# TYPE sepa_cloud_batches_rejected_total counter")
        for reason, count in sorted(self.rejected.items()):
            lines.append(f'sepa_cloud_batches_rejected_total{{reason="{reason}"}} {count}')
        _counter(
            lines,
            "connections_refused",
            "Connections closed at once, past max_connections.",
            self.guards["connections_refused"],
        )
        lines.append("# HELP sepa_cloud_requests_timed_out_total Requests cut (408), by the part that was too slow.")
        lines.append("# TYPE sepa_cloud_requests_timed_out_total counter")
        for phase in ("head", "body"):
            lines.append(f'sepa_cloud_requests_timed_out_total{{phase="{phase}"}} {self.guards["timeout_" + phase]}')
        return "\n".join(lines) + "\n"


def _counter(lines: list[str], name: str, help_text: str, value: int) -> None:
    lines.append(f"# HELP sepa_cloud_{name}_total {help_text}")
    lines.append(f"# TYPE sepa_cloud_{name}_total counter")
    lines.append(f"sepa_cloud_{name}_total {value}")
