"""The whole pipeline for the end-to-end tests: Mosquitto -> `sepa-gateway run` (MQTT adapter + cloud
shipper, on-disk store) -> the HTTPS landing endpoint -> the Spark streaming job -> Parquet."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud.settings import LandingSettings
from cloud.stream import StreamOptions, start
from tests.cloud.cloud_support import TOKEN, LandingServer
from tests.support.leftovers import ended
from tools.launcher import RunningGateway, launch_gateway
from tools.mosquitto import Mosquitto

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_ID = "pipeline-gw"  # its shipper's batch ids start with it: the landing's token is bound to it


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `predicate` until it is true, at most `timeout` s. A poll whose request timed out counts
    as not yet: a gateway restarted onto a backlog (a burst of queued MQTT readings, a replica catching
    up) may take longer than one request's 30 s on a loaded machine (CI once, 41 min run)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except TimeoutError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@dataclass
class Pipeline:
    """One run's parts and paths; the landing endpoint can be down (an outage) and come back on its port."""

    directory: Path
    mosquitto: Mosquitto
    landing_settings: LandingSettings
    landing: LandingServer | None = None
    gateway: RunningGateway | None = None
    publishers: list[subprocess.Popen[bytes]] = field(default_factory=list)  # ended by close()

    @property
    def config(self) -> Path:
        path = self.directory / "gateway.toml"
        token = self.directory / "token"
        token.write_text(TOKEN + "\n")
        path.write_text(
            f'[mqtt]\nport = {self.mosquitto.port}\nclient_id = "pipeline-{self.mosquitto.port}"\n'
            'profiles = ["generic", "senml"]\n'
            f'[observations]\ngateway_id = "{GATEWAY_ID}"\nretain_count = 1000000\nprune_interval_s = 3600.0\n'
            f'[shipper]\nenabled = true\nurl = "https://127.0.0.1:{self.landing_settings.port}"\n'
            f'token_file = "{token}"\nca_file = "{self.landing_settings.cert}"\n'
            "segment_max_bytes = 262144\nsegment_max_age_s = 0.5\nbackoff_initial_s = 0.1\nbackoff_max_s = 0.5\n"
        )
        return path

    def start_gateway(self) -> RunningGateway:
        self.gateway = launch_gateway(config=self.config, data_dir=self.directory / "data")
        wait_for(lambda: self.metrics().get("sepa_mqtt_connection_subscribed") == 1.0, 30, "the MQTT connection")
        return self.gateway

    def metrics(self) -> dict[str, float]:
        assert self.gateway is not None
        return self.gateway.metrics()

    def start_landing(self) -> LandingServer:
        self.landing = LandingServer(self.landing_settings).__enter__()
        return self.landing

    def stop_landing(self) -> None:
        if self.landing is not None:
            self.landing.__exit__(None, None, None)
            self.landing = None

    def landed_records(self) -> int:
        assert self.landing is not None and self.landing.landing is not None
        return self.landing.landing.metrics.records_stored

    def stored_observations(self) -> int:
        rows = self._select(
            "SELECT (COUNT(?o) AS ?n) WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> "
            "{ ?o a <http://www.w3.org/ns/sosa/Observation> } }"
        )
        return int(rows[0]["n"])

    def observation_ids(self) -> set[str]:
        """The IRIs of every observation in the gateway's store: what the table must hold, once each."""
        rows = self._select(
            "SELECT ?o WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> "
            "{ ?o a <http://www.w3.org/ns/sosa/Observation> } }"
        )
        return {row["o"] for row in rows}

    def _select(self, sparql: str) -> list[dict[str, str]]:
        """Rows of a SELECT, asked again while the gateway answers 503 "retry later", as it tells a
        client to: a burst of readings faster than the query workers' replicas follow leaves them
        stale, and the first query after it waits for a new one, seeded from a dump of the store
        (100,000 readings, 1.3 million quads: 4-5 s in memory and resident, ~12 s with the full suite
        beside it before the seed was dumped whole; milliseconds on RocksDB)."""
        assert self.gateway is not None
        deadline = time.monotonic() + 120
        reply = self.gateway.query(sparql)
        while reply.status == 503 and time.monotonic() < deadline:
            reply = self.gateway.query(sparql)
        assert reply.status == 200, reply.body
        return [{name: term["value"] for name, term in row.items()} for row in reply.json()["results"]["bindings"]]

    def publish_generic(self, first: int, count: int, *, processes: int = 1) -> list[subprocess.Popen[bytes]]:
        """Readings k = first..first+count-1, value k, on `gateway/bench<k % 100>/temperature` (QoS 1)."""
        per = count // processes
        started = [
            subprocess.Popen(
                [sys.executable, "-m", "tools.mqtt_bench.publisher", "--port", str(self.mosquitto.port),
                 "--first", str(first + i * per), "--count", str(per), "--sensors", "100"],
                cwd=ROOT, stdout=subprocess.DEVNULL,
            )
            for i in range(processes)
        ]  # fmt: skip
        self.publishers += started
        return started

    def publish_senml(self, first: int, count: int) -> subprocess.Popen[bytes]:
        """SenML readings with their own timestamps (stable observation IRIs across redeliveries)."""
        publisher = subprocess.Popen(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(self.mosquitto.port), "-q", "1", "-t", "senml/k9", "-l"],
            stdin=subprocess.PIPE,
        )
        self.publishers.append(publisher)
        assert publisher.stdin is not None
        lines = (
            f'[{{"n":"temperature","u":"Cel","v":{k},"t":{1_795_000_000 + k / 1000:.3f}}}]\n'
            for k in range(first, first + count)
        )
        publisher.stdin.write("".join(lines).encode())
        publisher.stdin.close()
        return publisher

    def drained(self, total: int) -> bool:
        """Every observation the store holds has landed (the gateway's backlog is empty)."""
        metrics = self.metrics()
        return (
            metrics.get("sepa_mqtt_readings", 0) >= total
            and metrics.get("sepa_shipper_backlog_observations", -1) == 0
            and self.landed_records() >= total
        )

    def spark_table(self, spark: Any) -> Any:
        """Run the streaming job over the landing directory (available-now) and read the table back."""
        table = self.directory / "table"
        options = StreamOptions(
            landing=str(self.landing_settings.landing_dir),
            table=str(table),
            checkpoint=str(self.directory / "checkpoint"),
            available_now=True,
            max_files_per_trigger=1000,
        )
        start(spark, options).awaitTermination()
        return spark.read.parquet(str(table))

    def close(self) -> None:
        for publisher in self.publishers:  # a test that failed before waiting for them
            ended(publisher)
        if self.gateway is not None and self.gateway.running:
            self.gateway.stop()
        self.stop_landing()
