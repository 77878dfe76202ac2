"""The transaction coordinator: Percolator's primary, fencing, table holds, snapshots.

No gRPC here. Every state change follows one pattern (as Kafka's transaction coordinator does):
prepare a copy of the record, persist it (compare-and-set in the store, durable before return),
and only then apply it in memory and answer. Expected refusals raise the named errors of
``percolake.errors``; a broken invariant raises AssertionError.

Concurrency: one lock guards the in-memory state; Delta I/O (roll-forward) and file deletion run
outside it. A table is *held* by the transaction that declared it until that transaction aborts
or reports the table applied, so per table at most one committed write is ever unapplied and
Delta versions follow commit_ts order (I7).
"""

from coordinator.core.applying import Applying
from coordinator.core.fencing import Fencing
from coordinator.core.leases import Leases
from coordinator.core.maintenance import Maintenance
from coordinator.core.opening import Opening
from coordinator.core.pipelines import Pipelines
from coordinator.core.quarantine import Quarantining
from coordinator.core.revision import Revising
from coordinator.core.snapshots import Snapshots
from coordinator.core.state import CoordinatorConfig, CoreState, Snapshot
from coordinator.core.topology import Topology
from coordinator.core.vacuum import Vacuuming
from coordinator.core.writing import Writing

__all__ = ["CoordinatorConfig", "CoreState", "Snapshot", "TransactionCoordinator"]


class TransactionCoordinator(Pipelines, Opening, Writing, Applying, Snapshots, Maintenance,
                             Fencing, Topology, Leases, Vacuuming, Revising, Quarantining):
    """The coordinator's core: every RPC of the service is one method here, each request
    family in its own module over one shared state (``CoreState``)."""
