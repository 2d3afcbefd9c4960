"""Fixtures of the CoAP adapter's tests: libcoap's coap-client (fails, never skips, when missing)."""

from __future__ import annotations

import pytest

from tools.coap import libcoap


@pytest.fixture
def coap_client() -> str:
    tool = libcoap.coap_client()
    if tool is None:
        pytest.fail(libcoap.MISSING, pytrace=False)
    return tool
