"""Spark settings every JVM of the suite's Spark applications shares (the shared test
sessions, the crash suite's drivers and readers, the cluster's applications)."""

from __future__ import annotations

# The tests' queries are many and their data tiny: generating and compiling Java code for each
# query (Spark's default) costs more CPU than interpreting it, with the same results (Spark's
# own tests run in both modes). The suite is CPU-bound on two cores.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false",
               "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
