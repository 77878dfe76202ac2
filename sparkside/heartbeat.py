"""A background thread that keeps a transaction alive from Open until Commit."""

from __future__ import annotations

import logging
import threading

from percolake.v1 import coordinator_pb2 as pb
from sparkside.client import CoordinatorClient

log = logging.getLogger("percolake.heartbeat")


class Heartbeat:
    """Heartbeats ``txn_id`` every ``interval_s`` (at most a third of the timeout) until stopped."""

    def __init__(self, client: CoordinatorClient, txn_id: str, epoch: int | None,
                 interval_s: float) -> None:
        self._client = client
        self._request = pb.HeartbeatRequest(txn_id=txn_id)
        if epoch is not None:
            self._request.epoch = epoch
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{txn_id[:8]}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                reply = self._client.call("Heartbeat", self._request, retry_s=self._interval)
            except Exception as exc:  # the commit will tell; keep trying while the batch runs
                log.warning("heartbeat failed: %s", exc)
                continue
            if reply.state != pb.OPEN and reply.state != pb.PREWRITTEN:
                log.warning("transaction %s is %s; stopping heartbeats",
                            self._request.txn_id, pb.TransactionState.Name(reply.state))
                return
            if reply.expires_in_ms:
                self._interval = min(self._interval, reply.expires_in_ms / 3000)
