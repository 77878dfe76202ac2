"""Expected protocol errors, as values with a clear name.

Each maps to one gRPC status in ``coordinator/status_codes.py``. A broken invariant is not one of
these: it raises AssertionError (or IllegalTransition) and is loud.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """An expected, named refusal: the request changed nothing (unless said otherwise)."""


class InvalidArgument(ProtocolError):
    pass


class NotFound(ProtocolError):
    pass


class AlreadyExists(ProtocolError):
    pass


class FailedPrecondition(ProtocolError):
    pass


class Fenced(FailedPrecondition):
    """The request carries an epoch older than the pipeline's current one (a zombie driver)."""


class QueryIdMismatch(FailedPrecondition):
    """The pipeline is bound to another Spark query id: the checkpoint was deleted or replaced."""


class TableQuarantined(FailedPrecondition):
    """The table's committed row-level write cannot be applied as it read the table (I12): new
    commits to it are refused until an operator runs ``percolake-coordinator tables
    release-quarantine`` (docs/row-level-writes.md, "Quarantine")."""


class CannotApplyAsRead(FailedPrecondition):
    """A committed row-level write whose table an outside writer changed after the version it
    read (I12): it is never applied against other data (docs/row-level-writes.md). ``problem``
    names the conflicting commit."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


class Conflict(ProtocolError):
    """Write-write conflict: the table is held by another live transaction."""


class TransactionAborted(ProtocolError):
    """The transaction was aborted (by timeout, a newer attempt, or a request)."""


class PermissionDenied(ProtocolError):
    pass


class ResourceExhausted(ProtocolError):
    pass


class Unavailable(ProtocolError):
    """Retry later: e.g. a roll-forward could not finish within the reader's wait."""


class DeadlineExceeded(ProtocolError):
    pass


class Overloaded(ResourceExhausted):
    """A load-shedding refusal (too many calls, waiters or requests per second): nothing was
    done; the same request may be sent again after a pause. Marked for clients with the
    trailing metadata ``percolake-retry``."""


class StoreConflict(Exception):
    """A compare-and-set update matched no row: the commit failed, re-read and retry."""


class CommitStateUnknown(Exception):
    """The store may or may not have made a write durable: never guess, re-read."""


class NotLeader(Unavailable):
    """This coordinator process does not hold the leader lease (a standby, or a leader whose
    lease was taken over): nothing was done; the client retries at the leader."""


class StoreUnavailable(CommitStateUnknown):
    """The store could not be reached (connection refused or cut, server restarting); a write
    in flight may or may not have become durable, so its outcome must be re-read."""
