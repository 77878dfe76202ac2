"""percolake coordinator: timestamp oracle, state machine, durable store, gRPC service."""
