"""The operator's command line, ``percolake-coordinator`` / ``python -m coordinator``: the top
layer of ``coordinator``, which no module of the daemon imports (docs/design-notes.md, "Layers
of the daemon").

``program`` (the parser of every command, ``serve``, ``reset-pipeline``), ``operations``
(``transactions``, ``pipelines``, ``snapshot``), ``topology``, ``vacuum``, ``revise``, ``auth``
(``acl``, ``tokens``, serve's authentication flags); ``client``: what every client command
shares (connection flags, leader following, exit status).
"""

from coordinator.cli.client import client_follower
from coordinator.cli.program import main, run

__all__ = ["client_follower", "main", "run"]
