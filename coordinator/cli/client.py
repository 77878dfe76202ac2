"""What every client command of the CLI shares: its connection flags and the one way it calls
the coordinator (leader following, TLS and token, exit status)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from percolake.credentials import add_client_arguments, security_from_args
from percolake.leader import LeaderFollower, default_channel

CALL_TIMEOUT_S = 30.0
Call = Callable[[str, Any], Any]  # (stub method name, request) -> reply


def add_common_arguments(parser: argparse.ArgumentParser, default_target: str) -> None:
    """``--target``, ``--json`` and the client security flags."""
    parser.add_argument("--target", default=default_target,
                        help="coordinator address HOST:PORT, or several separated by commas "
                        "(h1:50051,h2:50051): each request follows the leader, retried for "
                        f"up to {CALL_TIMEOUT_S:.0f} s")
    parser.add_argument("--json", action="store_true",
                        help="print JSON (for scripts) instead of a readable table")
    add_client_arguments(parser)


def client_follower(args: argparse.Namespace) -> LeaderFollower:
    """The leader-following client of a command with ``--target`` and the flags of
    :func:`percolake.credentials.add_client_arguments` (the environment filling the rest).

    Raises:
        ValueError: ``--target`` is not HOST:PORT[,...], or a security setting is unusable.
    """
    security = security_from_args(args)
    return LeaderFollower(args.target, functools.partial(default_channel, security=security))


def run_calls(name: str, args: argparse.Namespace, work: Callable[[Call], str]) -> int:
    """Runs ``work`` with a function that calls the coordinator and prints what it returns.

    Returns:
        0 done; 1 the coordinator refused (its status and message on stderr); 2 unusable
        settings, before anything is sent.
    """
    import grpc

    try:
        follower = client_follower(args)
    except ValueError as exc:
        print(f"{name} failed: {exc}", file=sys.stderr)
        return 2

    def call(method: str, request: Any) -> Any:
        return follower.call(method, request, timeout_s=CALL_TIMEOUT_S, retry_s=CALL_TIMEOUT_S)

    try:
        output = work(call)
    except grpc.RpcError as exc:
        print(f"{name} failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        follower.close()
    print(output)
    return 0
