"""The version of the running code, from the installed package's metadata.

Why from the metadata: pyproject.toml's ``version`` is the one place a release is numbered; pip
copies it into the distribution's metadata, so ``sepa-gateway --version``, ``/metrics``
(``sepa_build_info``) and ``/health`` cannot disagree with it or with each other.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "sepa-gateway"


@cache
def gateway_version() -> str:
    """The installed distribution's version; "unknown" when the code runs from a tree never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
