"""Channel set-up in one place (TLS and tokens slot in here)."""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def make_channel(target: str) -> grpc.Channel:
    """An insecure channel to the coordinator with percolake's message limits."""
    return grpc.insecure_channel(target, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ])
