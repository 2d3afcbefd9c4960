"""Token buckets per address: shared by an address's connections, forgotten with the last of them."""

from __future__ import annotations

from broker.gates.budget import PerAddress, TokenBucket


def test_a_bucket_refills_at_its_rate_up_to_its_burst_and_an_overdraft_leaves_it_empty() -> None:
    bucket = TokenBucket(burst=10, rate=5)
    assert bucket.take(10, now=0.0)
    assert not bucket.take(1, now=0.0)
    assert bucket.tokens == 0  # not in debt: what overdrew it was refused
    assert bucket.take(5, now=1.0)
    assert not bucket.take(1, now=1.0)
    assert bucket.take(10, now=100.0)  # no more than the burst saved up


def test_an_addresses_connections_share_one_bucket_kept_while_any_is_open() -> None:
    budgets = PerAddress(lambda: TokenBucket(burst=10, rate=1))
    first, second = budgets.join("192.0.2.7"), budgets.join("192.0.2.7")
    assert first is second
    assert budgets.join("192.0.2.8") is not first
    assert first.take(10, now=0.0)
    assert not second.take(1, now=0.0)
    budgets.leave("192.0.2.7")
    assert budgets.join("192.0.2.7") is first  # one connection of it is still open
    budgets.leave("192.0.2.7")
    budgets.leave("192.0.2.7")
    budgets.leave("192.0.2.8")
    assert len(budgets) == 0
