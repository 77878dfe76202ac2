"""Where the test set-up keeps what it builds once per machine (SeaweedFS's ``weed``, the JVMs'
class archive): ``$PERCOLAKE_CACHE``, default ``~/.cache/percolake``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PERCOLAKE_CACHE"


def project_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "percolake")
