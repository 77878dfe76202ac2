"""A stand-in for ``grpc.ServicerContext`` to call the servicer's methods in process (the
tests' and ``scripts/bench_core.py``'s): what the servicer touches on a call that succeeds."""

from __future__ import annotations


class InProcessContext:
    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"the servicer refused the call: {code}: {details}")

    def set_trailing_metadata(self, metadata: object) -> None:
        return

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"
