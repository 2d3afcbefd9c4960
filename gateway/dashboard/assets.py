"""The dashboard's files, read once at start-up and kept in memory with their gzip and ETag.

Why in memory: the files are a few tens of kilobytes, served to a handful of browsers; reading
them once keeps file I/O off the event loop for good, and compressing them once makes gzip free
per request (the page weight budget is 300 KB transferred; uPlot alone is 51 KB, 22 KB gzipped).
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    "": "text/plain; charset=utf-8",  # LICENSE, VERSION
}
# below this, gzip's header costs more than it saves
GZIP_MIN_BYTES = 512


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    content_type: str
    etag: str


def asset(body: bytes, content_type: str) -> Asset:
    """One file's reply material: its bytes, their gzip (when it pays) and a strong ETag."""
    gzipped = gzip.compress(body, compresslevel=9, mtime=0) if len(body) >= GZIP_MIN_BYTES else None
    if gzipped is not None and len(gzipped) >= len(body):
        gzipped = None
    return Asset(body, gzipped, content_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def load_assets(directory: Path = STATIC) -> dict[str, Asset]:
    """Every file under `directory`, keyed by its path relative to it with `/` separators; a file
    of a type not in CONTENT_TYPES is a mistake of ours, refused here rather than served as bytes."""
    assets: dict[str, Asset] = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        content_type = CONTENT_TYPES.get(path.suffix)
        if content_type is None:
            raise ValueError(f"dashboard file of unknown type: {path}")
        assets[path.relative_to(directory).as_posix()] = asset(path.read_bytes(), content_type)
    return assets
