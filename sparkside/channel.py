"""Channel set-up in one place: message limits, fast reconnects, TLS and the bearer token."""

from __future__ import annotations

import grpc

from percolake.credentials import ClientSecurity, open_channel
from percolake.leader import RECONNECT_OPTIONS

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def make_channel(address: str, security: ClientSecurity | None = None) -> grpc.Channel:
    """A channel to one coordinator ``host:port`` with percolake's message limits; TLS and the
    bearer token as ``security`` says (None: from the ``PERCOLAKE_*`` environment variables).

    It reconnects within a second, so a coordinator that became the leader is reached at once.
    """
    return open_channel(address, security, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
        *RECONNECT_OPTIONS,
    ])
