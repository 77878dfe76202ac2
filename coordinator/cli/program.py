"""Command line: ``percolake-coordinator`` / ``python -m coordinator``.

Commands:
  serve           run the coordinator daemon
  reset-pipeline  start a new generation of a pipeline (after its checkpoint was replaced)
  acl             add, remove or list permissions (docs/security.md)
  tokens          create, revoke or list bearer tokens
  transactions    list, describe, abort transactions; find hanging ones (docs/operations.md)
  pipelines       list or describe pipelines
  snapshot        a consistent Delta version per table
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import NoReturn

from coordinator import limits
from coordinator.cli import auth as auth_cli
from coordinator.cli import operations as ops_cli
from coordinator.cli import optimize as optimize_cli
from coordinator.cli import revise as revise_cli
from coordinator.cli import tables as tables_cli
from coordinator.cli import topology as topology_cli
from coordinator.cli import vacuum as vacuum_cli
from coordinator.cli.client import client_follower
from percolake.credentials import add_client_arguments

DEFAULT_PORT = 50051


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0..65535, got {text!r}")
    return value


def _retention(text: str) -> float:
    value = float(text)
    if value != 0 and value < 24:
        raise argparse.ArgumentTypeError(f"must be 0 (keep everything) or >= 24, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="percolake-coordinator",
        description="percolake coordinator: atomic, exactly-once multi-table Delta Lake "
        "transactions for Spark Structured Streaming.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve", help="run the coordinator daemon",
        description="Run the coordinator daemon. It serves percolake.v1.Coordinator, gRPC "
        "health and server reflection (so grpcurl can list and call it), keeps its records in "
        "SQLite under --data-dir or in PostgreSQL (--store), and shuts down gracefully on "
        "SIGTERM or SIGINT. Several daemons on one PostgreSQL store are active-standby: the "
        "one holding the leader lease serves, the others answer UNAVAILABLE naming it and "
        "take over when its lease runs out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0 for every interface)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="TCP port to listen on; 0 picks a free port (see --port-file)")
    serve.add_argument("--data-dir",
                       help="folder of the SQLite store (created if missing); keep it on "
                       "durable local disk: it holds every commit decision. Required unless "
                       "--store names PostgreSQL")
    serve.add_argument("--store", default="", metavar="URL",
                       help="where the records live: empty or 'sqlite' for SQLite under "
                       "--data-dir; postgresql://USER@HOST:PORT/DB or "
                       "postgresql://USER@/DB?host=/socket/dir for PostgreSQL, shared by "
                       "several daemons of which the lease holder serves (its password is "
                       "never logged; prefer PGPASSWORD or ~/.pgpass)")
    serve.add_argument("--advertise", default="", metavar="HOST:PORT",
                       help="the address clients reach this daemon at, which standbys name in "
                       "their UNAVAILABLE answers (default: --host, or this machine's name "
                       "when --host is 0.0.0.0, and the bound port)")
    serve.add_argument("--lease-s", type=_positive(float), default=2.0, metavar="SECONDS",
                       help="leader lease length with a PostgreSQL store: renewed every "
                       "quarter of it; a standby takes over this long after the leader "
                       "stopped renewing")
    serve.add_argument("--node-id", default="", metavar="ID",
                       help="this daemon's name in the lease (default: host:pid:random); "
                       "unique per running process")
    serve.add_argument("--warehouse", action="append", required=True, metavar="ROOT",
                       help="a folder (/lake) or object-store prefix (s3://bucket/lake; "
                       "s3a:// names the same) under which Delta tables may live; repeat for "
                       "several, local and S3 mixed. Tables outside every root are refused "
                       "with PERMISSION_DENIED. S3 settings come from AWS_ACCESS_KEY_ID, "
                       "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL, "
                       "AWS_ALLOW_HTTP or AWS_PROFILE")
    serve.add_argument("--txn-timeout", type=_positive(float), default=120.0, metavar="SECONDS",
                       help="an OPEN or PREWRITTEN transaction with no heartbeat for this long "
                       "is aborted and its files deleted")
    serve.add_argument("--conflict-wait", type=_positive(float), default=10.0, metavar="SECONDS",
                       help="how long a write waits for a table held by another live "
                       "transaction before failing with ABORTED naming the holder")
    serve.add_argument("--snapshot-wait", type=_positive(float), default=30.0, metavar="SECONDS",
                       help="how long GetSnapshot may spend rolling committed writes forward "
                       "before it fails with DEADLINE_EXCEEDED")
    serve.add_argument("--roll-forward-after", type=_positive(float), default=10.0,
                       metavar="SECONDS",
                       help="a committed write whose participant has not applied it after this "
                       "long is applied by the coordinator itself")
    serve.add_argument("--max-intent-bytes", type=_positive(int), default=16 * 1024 * 1024,
                       help="largest write intent of one table; larger ones are refused with "
                       "RESOURCE_EXHAUSTED, never truncated")
    serve.add_argument("--retention-hours", type=_retention, default=168.0, metavar="HOURS",
                       help="APPLIED and ABORTED transactions older than this are deleted from "
                       "the store (keeping what latest snapshots, replays and time travel after "
                       "the horizon need); time travel to before it is refused. At least 24 "
                       "(aborted attempts are swept for 24 h); 0 keeps everything")
    serve.add_argument("--max-message-bytes", type=_positive(int), default=64 * 1024 * 1024,
                       help="largest gRPC message accepted or sent (a larger request or reply "
                       "is refused with RESOURCE_EXHAUSTED)")
    serve.add_argument("--max-workers", type=_positive(int), default=32,
                       help="threads serving RPCs")
    limits.add_arguments(serve)
    serve.add_argument("--barrier-interval", type=_positive(float), default=5.0,
                       metavar="SECONDS",
                       help="global barriers of the ETL topology every this many seconds of "
                       "oracle time (docs/topology.md)")
    serve.add_argument("--shared-table-writers", action="store_true",
                       help="let several pipelines write one table (each table's first "
                       "writer is still recorded as its owner); off, a second writing "
                       "pipeline is refused with FAILED_PRECONDITION naming the owner")
    serve.add_argument("--shutdown-grace", type=_positive(float), default=10.0,
                       metavar="SECONDS", help="time in-flight RPCs get to finish on shutdown")
    serve.add_argument("--object-store-timeout", type=_positive(float), default=30.0,
                       metavar="SECONDS",
                       help="each object-store (S3) request times out after this long and is "
                       "retried at most 3 times; then the call fails with UNAVAILABLE")
    serve.add_argument("--metrics-port", type=_port, default=0, metavar="PORT",
                       help="serve Prometheus metrics at HOST:PORT/metrics on the --host "
                       "address, over HTTPS with --tls-cert (else HTTP); with --client-ca it "
                       "needs a client certificate, with --authenticate a bearer token or "
                       "client certificate whose principal has DESCRIBE on every pipeline "
                       "(docs/metrics.md); 0: no metrics endpoint")
    serve.add_argument("--metrics-open", action="store_true",
                       help="serve /metrics to anyone who reaches the port, without a "
                       "credential, even with --authenticate or --client-ca; needed for open "
                       "metrics on an address other than loopback")
    serve.add_argument("--http-port", type=_port, default=0, metavar="PORT",
                       help="serve the read-only web view (HTML pages and /api JSON) at "
                       "HOST:PORT/ on the --host address, over HTTPS with --tls-cert (else "
                       "HTTP); it asks what gRPC asks: a client certificate with --client-ca, "
                       "with --authenticate 'Authorization: Bearer <token>' or that "
                       "certificate (docs/operations.md); 0: off")
    serve.add_argument("--port-file", metavar="PATH",
                       help="write the bound port to this file once serving (for --port 0)")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"], help="log verbosity")
    serve.add_argument("--log-format", default="json", choices=["json", "text"],
                       help="json: one structured object per line on stderr")
    serve.add_argument("--tls-cert", default="", metavar="PEM",
                       help="serve TLS with this certificate (chain) file; needs --tls-key. "
                       "Health and reflection are served over the same TLS port")
    serve.add_argument("--tls-key", default="", metavar="PEM",
                       help="the private key of --tls-cert (unencrypted PEM)")
    serve.add_argument("--client-ca", default="", metavar="PEM",
                       help="require a client certificate signed by this CA bundle (mutual "
                       "TLS); needs --tls-cert and --tls-key")
    serve.add_argument("--insecure", action="store_true",
                       help="serve an address other than loopback without TLS and "
                       "authentication anyway (logged as a warning); refused otherwise")
    auth_cli.add_serve_arguments(serve)

    reset = commands.add_parser(
        "reset-pipeline", help="start a new generation of a pipeline",
        description="Start a new generation of a pipeline whose streaming checkpoint was "
        "deleted or replaced. Live attempts of the old generation are aborted, old drivers are "
        "fenced, committed data is never touched, and the history stays readable.")
    reset.add_argument("--target", default=f"127.0.0.1:{DEFAULT_PORT}",
                       help="coordinator address HOST:PORT, or several separated by commas "
                       "(h1:50051,h2:50051): the request follows the leader, retried for up "
                       "to 30 s; without --generation it is a compare-and-set on the "
                       "generation read first, so a retry never resets twice")
    reset.add_argument("--pipeline", required=True, help="the pipeline id")
    reset.add_argument("--reason", required=True, help="why; recorded with the reset")
    reset.add_argument("--generation", type=int,
                       help="reset only if this is the current generation (compare-and-set); "
                       "repeating a succeeded request then changes nothing")
    reset.add_argument("--query-id",
                       help="bind the new generation to this Spark query id (the new "
                       "checkpoint's) at once; the current or an earlier generation's query id "
                       "is refused (its replays would be written twice)")
    reset.add_argument("--start-barrier", type=_non_negative_int,
                       help="where the new generation's percolake input starts (an oracle "
                       "timestamp, such as a barrier `topology --json` shows); default: the "
                       "last input barrier the pipeline committed. Give one at or above the "
                       "retention floor when a downstream pipeline's sources start below "
                       "pruned history")
    add_client_arguments(reset)
    auth_cli.add_commands(commands, f"127.0.0.1:{DEFAULT_PORT}")
    ops_cli.add_commands(commands, f"127.0.0.1:{DEFAULT_PORT}")
    topology_cli.add_command(commands, f"127.0.0.1:{DEFAULT_PORT}")
    vacuum_cli.add_command(commands, f"127.0.0.1:{DEFAULT_PORT}")
    revise_cli.add_command(commands, f"127.0.0.1:{DEFAULT_PORT}")
    tables_cli.add_commands(commands, f"127.0.0.1:{DEFAULT_PORT}")
    optimize_cli.add_command(commands, f"127.0.0.1:{DEFAULT_PORT}")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from coordinator import logs
    from coordinator.core import CoordinatorConfig
    from coordinator.server import ServerOptions, is_sqlite, serve_forever

    if is_sqlite(args.store) and not args.data_dir:
        print("percolake-coordinator serve: error: the argument --data-dir is required with "
              "the SQLite store (no --store, or --store sqlite)", file=sys.stderr)
        return 2
    if args.advertise:
        from percolake.leader import parse_targets

        try:
            if len(parse_targets(args.advertise)) != 1:
                raise ValueError("give one HOST:PORT")
        except ValueError as exc:
            print(f"percolake-coordinator serve: error: --advertise: {exc}", file=sys.stderr)
            return 2
    if problem := limits.settings_error(args):
        print(f"percolake-coordinator serve: error: {problem}", file=sys.stderr)
        return 2
    logs.configure(args.log_level, args.log_format)
    config = CoordinatorConfig(
        warehouse_roots=args.warehouse, txn_timeout_s=args.txn_timeout,
        conflict_wait_s=args.conflict_wait, snapshot_wait_s=args.snapshot_wait,
        roll_forward_after_s=args.roll_forward_after, max_intent_bytes=args.max_intent_bytes,
        retention_hours=args.retention_hours, barrier_interval_s=args.barrier_interval,
        shared_table_writers=args.shared_table_writers, **limits.config_fields(args),
    )
    options = ServerOptions(**limits.option_fields(args),
                            host=args.host, port=args.port, max_workers=args.max_workers,
                            max_message_bytes=args.max_message_bytes,
                            shutdown_grace_s=args.shutdown_grace,
                            object_store_timeout_s=args.object_store_timeout,
                            store_url=args.store, advertise=args.advertise,
                            lease_s=args.lease_s, node_id=args.node_id,
                            tls_cert=args.tls_cert, tls_key=args.tls_key,
                            client_ca=args.client_ca, insecure=args.insecure,
                            metrics_port=args.metrics_port, metrics_open=args.metrics_open,
                            http_port=args.http_port,
                            **auth_cli.option_fields(args))
    return serve_forever(args.data_dir, config, options, args.port_file)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _reset(args: argparse.Namespace) -> int:
    import grpc

    from percolake.v1 import coordinator_pb2 as pb

    request = pb.ResetPipelineRequest(pipeline_id=args.pipeline, reason=args.reason)
    if args.query_id is not None:
        request.query_id = args.query_id
    if args.start_barrier is not None:
        request.start_barrier = args.start_barrier
    try:
        follower = client_follower(args)
    except ValueError as exc:
        print(f"reset-pipeline failed: {exc}", file=sys.stderr)
        return 2
    try:
        # Always a compare-and-set on the generation (the one seen now unless --generation):
        # a retry after an unknown outcome, at the same or a new leader, resets only once.
        request.expected_generation = args.generation if args.generation is not None else \
            follower.call("GetPipeline", pb.GetPipelineRequest(pipeline_id=args.pipeline),
                          timeout_s=30, retry_s=30).generation
        reply = follower.call("ResetPipeline", request, timeout_s=30, retry_s=30)
    except grpc.RpcError as exc:
        print(f"reset-pipeline failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        follower.close()
    print(json.dumps({
        "pipeline": reply.pipeline.pipeline_id, "generation": reply.pipeline.generation,
        "epoch": reply.pipeline.epoch, "changed": reply.changed,
        "aborted_txn_ids": list(reply.aborted_txn_ids),
    }))
    return 0


def run() -> NoReturn:
    """The process's entry point: ``main``, then an exit with its status that skips the
    interpreter's teardown, where pyarrow and deltalake's native threads can crash a process
    whose work is done (apache/arrow#34314; a SIGTERMed daemon exited with -11 after its
    clean shutdown). Everything is closed and flushed by then."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command in ("acl", "tokens"):
        return auth_cli.run(args)
    if args.command in ("transactions", "pipelines", "snapshot"):
        return ops_cli.run(args)
    if args.command == "topology":
        return topology_cli.run(args)
    if args.command == "vacuum":
        return vacuum_cli.run(args)
    if args.command == "revise":
        return revise_cli.run(args)
    if args.command == "tables":
        return tables_cli.run(args)
    if args.command == "optimize":
        return optimize_cli.run(args)
    return _reset(args)
