"""The shared layer under both ``coordinator`` (the daemon) and ``sparkside`` (the Spark client).

``percolake.v1`` is the generated gRPC code (scripts/gen_protos.py); the rest is protocol and lake
code with no server and no Spark in it: records and states, errors, the codec, failpoints, and
``percolake.lake`` (table URIs, Delta commits, attempt cleanup).
"""
