"""Channel set-up in one place (TLS and tokens slot in here)."""

from __future__ import annotations

import grpc

from percolake.leader import RECONNECT_OPTIONS

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def make_channel(address: str) -> grpc.Channel:
    """An insecure channel to one coordinator ``host:port`` with percolake's message limits.

    It reconnects within a second, so a coordinator that became the leader is reached at once.
    """
    return grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
        *RECONNECT_OPTIONS,
    ])
