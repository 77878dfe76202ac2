"""The topology check's Spark drivers, each run as its own process (so SIGKILL and failpoints
end it hard): the root pipeline ``bank`` and the downstream pipeline ``ledger``.

- ``--role root``: a folder of JSON input files (rows ``seq``, ``i``) read with
  ``maxFilesPerTrigger`` (default 1: a file per batch); each batch appends its transfers to
  ``debits`` (source account) and ``credits`` (target account) through the participant, with
  the batch's source offsets.
- ``--role ledger``: reads ``debits`` and ``credits`` through the percolake streaming source,
  unions them (debits negative) and appends one ledger row per input row (account, signed
  amount, the batch's input barrier). Before writing, it appends a digest of its input rows
  per batch to ``--events`` (JSON lines), so a test sees that a replay read the same rows.

Both run until ``--stop-file`` exists (the query is then stopped: exit 0) or they are killed;
exit 3 if the query failed.

    python -m tests.topology_driver --role ledger --target HOST:PORT --lake /lake \
        --checkpoint /ckpt/ledger --events digests.jsonl --stop-file stop.ledger
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

from tests.crash import workload


def _event(path: str, **fields: object) -> None:
    with open(path, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "wall": time.time(), **fields}) + "\n")
        out.flush()
        os.fsync(out.fileno())


def rows_digest(rows: list[tuple]) -> str:
    """A digest of a batch's input rows, independent of their order."""
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()


def root_query(spark, args: argparse.Namespace):  # noqa: ANN001, ANN201 - pyspark lazily
    from sparkside import Participant

    participant = Participant(args.target, pipeline_id=args.pipeline,
                              checkpoint_location=args.checkpoint)

    def write_batch(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        src = batch_df.selectExpr("CAST(seq AS BIGINT) AS seq", "CAST(i AS BIGINT) AS i")
        debits = src.selectExpr("seq AS batch", "i",
                                f"CAST({workload.SOURCE_SQL} AS BIGINT) AS account",
                                f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS amount")
        credits = src.selectExpr("seq AS batch", "i",
                                 f"CAST({workload.TARGET_SQL} AS BIGINT) AS account",
                                 f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS amount")
        txn.write(debits, f"{args.lake}/{workload.DEBITS}")
        txn.write(credits, f"{args.lake}/{workload.CREDITS}")

    stream = (spark.readStream.schema("seq long, i long")
              .option("maxFilesPerTrigger", args.max_files_per_trigger).json(args.input))
    query = (stream.writeStream.foreachBatch(participant.wrap(write_batch))
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=args.trigger).start())
    return query, participant


def ledger_query(spark, args: argparse.Namespace):  # noqa: ANN001, ANN201 - pyspark lazily
    from pyspark.sql import functions as F

    import sparkside
    from sparkside import Participant

    sparkside.register(spark)
    participant = Participant(args.target, pipeline_id=args.pipeline)

    def source(table: str):  # noqa: ANN202
        return (spark.readStream.format("percolake").option("coordinator", args.target)
                .option("pipeline", args.pipeline).load(f"{args.lake}/{table}"))

    debits = source(workload.DEBITS).select("batch", "i", "account",
                                            (-F.col("amount")).alias("amount"))
    credits = source(workload.CREDITS).select("batch", "i", "account", "amount")
    ledger = f"{args.lake}/ledger"

    def write_batch(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        rows = [tuple(r) for r in batch_df.collect()]
        _event(args.events, event="batch", batch=batch_id, rows=len(rows),
               digest=rows_digest(rows), input_barrier=txn.input_barrier)
        if rows:
            txn.write(batch_df.select("account", "amount",
                                      F.lit(txn.input_barrier).cast("bigint")
                                      .alias("input_barrier")), ledger)

    query = (debits.unionByName(credits).writeStream
             .foreachBatch(participant.wrap(write_batch))
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=args.trigger).start())
    return query, participant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("root", "ledger"), required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--pipeline", default=None, help="default: bank (root), ledger")
    parser.add_argument("--lake", required=True)
    parser.add_argument("--input", help="the root's input folder")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--trigger", default="500 milliseconds")
    parser.add_argument("--max-files-per-trigger", type=int, default=1,
                        help="the root's input files per batch")
    args = parser.parse_args(argv)
    args.pipeline = args.pipeline or ("bank" if args.role == "root" else "ledger")
    _event(args.events, event="start", role=args.role,
           failpoints=os.environ.get("PERCOLAKE_FAILPOINTS", ""))

    from tests.crash.driver import spark_session

    spark = spark_session(f"percolake-topology-{args.role}")
    spark.sparkContext.setLogLevel("ERROR")
    make = root_query if args.role == "root" else ledger_query
    query, participant = make(spark, args)
    try:
        while query.isActive and not os.path.exists(args.stop_file):
            query.awaitTermination(0.2)
        failure = query.exception()
        if failure is None:
            query.stop()
    except Exception as exc:  # awaitTermination raises the query's failure
        failure = exc
    if failure is not None:
        text = str(failure)[:4000]
        _event(args.events, event="error", role=args.role, message=text)
        print(f"QUERY FAILED: {text}", file=sys.stderr)
        traceback.print_exc()
        spark.stop()
        return 3
    _event(args.events, event="stopped", role=args.role)
    participant.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
