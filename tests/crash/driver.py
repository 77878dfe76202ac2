"""The crash suite's Spark driver: a real streaming query writing the bank workload through the
participant. Run as its own process, so a failpoint (env PERCOLAKE_FAILPOINTS) can kill it hard.

The source is a folder of JSON files, one per batch (``input_rows`` of workload.py), read with
``maxFilesPerTrigger=1`` and ``trigger(availableNow=True)``: batch ``b`` is file ``b`` on every
replay, and the query stops by itself once every file present at its start is processed.

    python -m tests.crash.driver --target HOST:PORT --pipeline bank --lake /lake \
        --input /in --checkpoint /lake/_checkpoints/bank --k 3 --events events.jsonl

Exit codes: 0 every batch done; 3 the query failed (the error is printed and in the events).
Each call of the user's function is an event, so a test sees whether a replay re-ran it.

``--lake`` may be an object-store prefix (``s3://bucket/prefix``, reached with the AWS variables
of the environment), and ``--master`` a standalone cluster's ``spark://127.0.0.1:PORT`` (with
``--spark-conf`` its application settings, JSON): the session is then ``local_spark``'s, with
delta-spark and, for an object-store lake, Hadoop's S3 connector. Without either the session is
the light local one of the fast crash tests. ``--row-level`` adds the MERGE and DELETE tables of
``row_level_job.py`` (a session with delta-spark), ``--final-read PATH`` has a driver that
finished every batch read every table's latest version with delta-spark into PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def _event(path: str, **fields: object) -> None:
    with open(path, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "wall": time.time(), **fields}) + "\n")
        out.flush()
        os.fsync(out.fileno())


def spark_session(app: str = "percolake-crash"):  # noqa: ANN201 - pyspark is imported lazily
    from pyspark.sql import SparkSession

    from tests.spark_settings import JVM_OPTIONS, suite_conf

    return (SparkSession.builder.config(map=suite_conf()).master("local[1]").appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.driver.extraJavaOptions",
                    f"{JVM_OPTIONS} -Xshare:auto")
            .config("spark.sql.streaming.stateStore.maintenanceInterval", "600s")
            .getOrCreate())


def remote_session(lake: str, master: str | None, conf: dict[str, str],
                   app: str = "percolake-crash"):  # noqa: ANN201 - pyspark is imported lazily
    """The session of a cluster or object-store run: ``local_spark`` on ``master`` (or two
    local cores) with the lake as its warehouse."""
    from sparkside.session import local_spark
    from tests.spark_settings import JVM_OPTIONS, suite_conf

    settings = {**suite_conf(),
                "spark.sql.streaming.stateStore.maintenanceInterval": "600s",
                "spark.driver.extraJavaOptions":
                    f"{JVM_OPTIONS} -Xshare:auto",
                **conf}
    return local_spark(app, cores=2, conf=settings, warehouse=lake, master=master)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--lake", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--events", required=True)
    parser.add_argument("--participant-options", default="{}",
                        help="JSON of extra keyword arguments of Participant")
    parser.add_argument("--master", default=None,
                        help="a standalone cluster's master URL (default: local)")
    parser.add_argument("--spark-conf", default="{}",
                        help="JSON of extra Spark settings (with --master or an s3:// lake)")
    parser.add_argument("--row-level", action="store_true",
                        help="also MERGE accounts and insert + delete large transfers "
                             "(tests/crash/row_level_job.py)")
    parser.add_argument("--final-read", default=None,
                        help="with --row-level: where to write delta-spark's latest reads")
    args = parser.parse_args(argv)
    _event(args.events, event="start", failpoints=os.environ.get("PERCOLAKE_FAILPOINTS", ""))

    from percolake.lake.warehouse import is_object_store
    from sparkside import Participant
    from tests.crash import row_level_job, workload

    if args.master or is_object_store(args.lake) or args.row_level:
        spark = remote_session(args.lake, args.master, json.loads(args.spark_conf))
    else:
        spark = spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    if args.row_level:
        row_level_job.create_tables(spark, args.lake)
    participant = Participant(args.target, pipeline_id=args.pipeline,
                              **json.loads(args.participant_options))
    k = args.k

    def write_batch(batch_df, batch_id, txn):  # noqa: ANN001 - the participant's callback
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        _event(args.events, event="user_fn", batch=batch_id, query_id=query_id)
        src = batch_df.selectExpr("CAST(seq AS BIGINT) AS seq", "CAST(i AS BIGINT) AS i")
        debits = src.selectExpr("seq AS batch", "i", f"CAST({workload.SOURCE_SQL} AS BIGINT) "
                                "AS account", f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS amount")
        credits = src.selectExpr("seq AS batch", "i", f"CAST({workload.TARGET_SQL} AS BIGINT) "
                                 "AS account", f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS amount")
        balances = batch_df.sparkSession.createDataFrame(
            workload.balance_rows(batch_id, k), "account long, balance long, batch long")
        txn.write(debits, f"{args.lake}/{workload.DEBITS}")
        txn.write(credits, f"{args.lake}/{workload.CREDITS}")
        txn.write(balances, f"{args.lake}/{workload.BALANCES}", mode="overwrite")
        if args.row_level:
            row_level_job.write_batch(txn, src, args.lake)

    stream = (spark.readStream.schema("seq long, i long").option("maxFilesPerTrigger", 1)
              .json(args.input))
    query = (stream.writeStream.foreachBatch(participant.wrap(write_batch))
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception as exc:
        text = str(exc)
        _event(args.events, event="error", message=text[:4000])
        print(f"QUERY FAILED: {text[:4000]}", file=sys.stderr)
        traceback.print_exc()
        spark.stop()
        return 3
    _event(args.events, event="done", query_id=query.id)
    participant.close()  # waits a bounded time for the last applied report
    if args.row_level and args.final_read:
        row_level_job.final_read(spark, args.lake, args.final_read)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
