"""broker.api, the broker's one entry point: every public name it lists resolves, on first use.

Protects: importing broker.api costs nothing until a name is used (the `sepa-gateway` commands
that need no store start without it), and the lazy table cannot drift from ``__all__``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import broker.api


def test_every_public_name_resolves_to_its_module_object() -> None:
    for name in broker.api.__all__:
        assert getattr(broker.api, name) is not None, name
    assert set(dir(broker.api)) >= set(broker.api.__all__)
    assert broker.api.COMPACTOR_THREAD == importlib.import_module("broker.compaction").THREAD_NAME
    assert broker.api.Engine is importlib.import_module("broker.core.engine").Engine


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        broker.api.Nothing  # noqa: B018


def test_importing_the_api_imports_no_store_and_no_gate() -> None:
    """Why: `from broker.api import gateway_version` loaded the engine, pyoxigraph and aiohttp."""
    probe = (
        "import sys, broker.api; from broker.api import gateway_version; "
        "print(sorted(m for m in ('pyoxigraph', 'aiohttp', 'broker.core.engine') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "[]\n"
