"""Durable names: what a rename or a creation in a directory needs to survive a power cut."""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(path: Path) -> None:
    """Make the names created or renamed in `path` durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
