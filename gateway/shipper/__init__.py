"""The cloud shipper (issue 7): every observation, flattened, to the cloud landing endpoint, exactly once.

records  -> observations graph feed rows to flat records (the cloud's schema)
spool    -> durable on-disk segments, sealed by size or age, and the resume cursor
uploader -> one HTTPS PUT per sealed segment, with the bearer token
shipper  -> the agent: subscribes, spools, uploads with backoff, observable
"""

from gateway.shipper.shipper import Shipper, ShipperSettings

__all__ = ["Shipper", "ShipperSettings"]
