"""The cloud shipper (issue 7): every observation, flattened, to the cloud landing endpoint, exactly once.

records  -> observations graph feed rows to flat records (the cloud's schema)
spool    -> durable on-disk segments, sealed by size or age, and the resume cursor
uploader -> one HTTPS PUT per sealed segment, with the bearer token
shipper  -> the agent: subscribes, spools, uploads with backoff, observable
contract -> what a record must be, shared with the cloud's landing (cloud/contract.py)

Why this file imports none of them: the landing imports the contract alone, and importing the
package imported the shipper, the client and with them the broker: `sepa-cloud landing` from start
to its first answered request took 1.70 CPU-s, 0.58 without them (2026-12-07, x86,
`/usr/bin/time -f %U+%S`, median of 5 runs alternated with the previous code).
Import what you use from its module: `from gateway.shipper.shipper import Shipper`.
"""
