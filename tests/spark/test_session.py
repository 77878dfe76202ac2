"""``sparkside.configure_spark``: what it adds to a builder, what it keeps, what it says.

The builder tests only read the builder's settings (no session is started); the last test
checks the shared session the fixtures built with it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.storage import StorageSettingsError
from sparkside import configure_spark
from sparkside import session as sessions
from sparkside.session import (
    CLUSTER_SNAPSHOT_PARTITIONS,
    DELTA_CATALOG,
    DELTA_EXTENSION,
    S3_CONNECTOR,
    SNAPSHOT_PARTITIONS,
    SPARK_PROVIDED,
    delta_package,
    first_fetch_notice,
    run_executors_on_driver_python,
    snapshot_partitions,
)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


def options(builder: SparkSession.Builder) -> dict[str, str]:
    return {k: str(v) for k, v in builder._options.items()}


def test_the_delta_jar_matches_the_installed_delta_spark_and_pyspark():
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert delta_package() == (f"io.delta:delta-spark_{spark_minor}_2.13:"
                               f"{importlib.metadata.version('delta-spark')}")


def test_configure_spark_adds_delta_spark_and_this_interpreter(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "placeholder")  # restored after the test
    monkeypatch.delenv("PYSPARK_PYTHON")
    got = options(configure_spark(SparkSession.builder))
    assert got["spark.jars.packages"] == delta_package()
    assert got["spark.jars.excludes"].split(",") == list(SPARK_PROVIDED)
    assert got["spark.sql.extensions"] == DELTA_EXTENSION
    assert got["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG
    assert got["spark.pyspark.python"] == sys.executable


def test_configure_spark_keeps_the_users_settings_and_is_idempotent(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "placeholder")  # restored after the test
    monkeypatch.delenv("PYSPARK_PYTHON")
    builder = (SparkSession.builder
               .config("spark.jars.packages", "org.example:extra_2.13:1.0")
               .config("spark.jars.excludes", "org.example:unwanted")
               .config("spark.sql.extensions", "org.example.Extension")
               .config("spark.sql.catalog.spark_catalog", "org.example.Catalog")
               .config("spark.pyspark.python", "/opt/python/bin/python3"))
    once = options(configure_spark(builder, extra_packages=["org.example:more_2.13:2.0"]))
    assert once["spark.jars.packages"].split(",") == [
        "org.example:extra_2.13:1.0", delta_package(), "org.example:more_2.13:2.0"]
    assert once["spark.jars.excludes"].split(",") == ["org.example:unwanted",
                                                      *SPARK_PROVIDED]
    assert once["spark.sql.extensions"] == f"org.example.Extension,{DELTA_EXTENSION}"
    assert once["spark.sql.catalog.spark_catalog"] == "org.example.Catalog"
    assert once["spark.pyspark.python"] == "/opt/python/bin/python3"
    assert options(configure_spark(builder)) == once


def test_delta_spark_state_reconstruction_is_sized_for_small_logs_unless_the_user_set_it():
    assert snapshot_partitions("local[3]") == 3
    assert snapshot_partitions("local[*]") == (os.cpu_count() or 1)
    assert snapshot_partitions("local") == 1
    assert snapshot_partitions("spark://127.0.0.1:7077") == CLUSTER_SNAPSHOT_PARTITIONS
    got = options(configure_spark(SparkSession.builder.master("local[3]")))
    assert got[SNAPSHOT_PARTITIONS] == "3"
    kept = options(configure_spark(SparkSession.builder.master("local[3]")
                                   .config(SNAPSHOT_PARTITIONS, "50")))
    assert kept[SNAPSHOT_PARTITIONS] == "50"


@pytest.fixture
def aws_env(monkeypatch, tmp_path):  # noqa: ANN001, ANN201
    """AWS variables of a made-up endpoint, and no profile files to fall back on."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    env = {"AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": "secret-" + "x" * 32,
           "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_ALLOW_HTTP": "true",
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_CONFIG_FILE": str(tmp_path / "none")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_a_warehouse_on_s3_adds_the_s3_connector_and_s3a_settings_from_the_environment(aws_env):
    got = options(configure_spark(SparkSession.builder, warehouse="s3a://lake/wh"))
    assert got["spark.jars.packages"].split(",") == [delta_package(), *S3_CONNECTOR]
    assert "software.amazon.awssdk:bundle" in got["spark.jars.excludes"].split(",")
    assert got["spark.hadoop.fs.s3a.access.key"] == "key-id"
    assert got["spark.hadoop.fs.s3a.secret.key"] == aws_env["AWS_SECRET_ACCESS_KEY"]
    assert got["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9"
    assert got["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert got["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert got["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"


def test_packages_whose_jars_the_driver_class_path_names_are_not_fetched_again(aws_env):
    group, artifact, version = delta_package().split(":")
    hadoop_aws = S3_CONNECTOR[0].split(":")
    on_path = os.pathsep.join([f"/offline/{group}_{artifact}-{version}.jar",  # Ivy's naming
                               f"/offline/{hadoop_aws[1]}-{hadoop_aws[2]}.jar",  # Maven's
                               f"/offline/crt-{S3_CONNECTOR[1].split(':')[1]}-9.jar"])
    builder = SparkSession.builder.config("spark.driver.extraClassPath", on_path)
    got = options(configure_spark(builder, warehouse="s3a://lake/wh"))
    assert got["spark.jars.packages"].split(",") == list(S3_CONNECTOR[1:])
    everything = os.pathsep.join([on_path, *(f"/offline/{p.split(':')[0]}_{p.split(':')[1]}-"
                                             f"{p.split(':')[2]}.jar" for p in S3_CONNECTOR)])
    got = options(configure_spark(SparkSession.builder.config(
        "spark.driver.extraClassPath", everything), warehouse="s3a://lake/wh"))
    assert "spark.jars.packages" not in got and "spark.jars.excludes" not in got
    assert got["spark.sql.extensions"] == DELTA_EXTENSION
    assert not sessions.on_class_path({"spark.driver.extraClassPath": f"/x/crt-{artifact}-"
                                       f"{version}.jar"}, delta_package())


def test_a_local_warehouse_gets_no_s3_connector(aws_env, tmp_path):
    got = options(configure_spark(SparkSession.builder, warehouse=[str(tmp_path)]))
    assert got["spark.jars.packages"] == delta_package()
    assert not any(k.startswith("spark.hadoop.fs.s3a.") for k in got)


def test_the_users_own_s3a_settings_win_whole(aws_env):
    builder = SparkSession.builder.config("spark.hadoop.fs.s3a.access.key", "theirs")
    got = options(configure_spark(builder, warehouse="s3://lake/wh"))
    assert got["spark.hadoop.fs.s3a.access.key"] == "theirs"
    assert "spark.hadoop.fs.s3a.secret.key" not in got
    assert "spark.hadoop.fs.s3a.endpoint" not in got


def test_an_s3_warehouse_without_credentials_names_the_variable(aws_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StorageSettingsError, match="AWS_ACCESS_KEY_ID"):
        configure_spark(SparkSession.builder, warehouse="s3://lake/wh")


def test_pyspark_python_from_the_environment_is_left_to_spark(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    assert "spark.pyspark.python" not in options(configure_spark(SparkSession.builder))
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python/bin/python3"


def test_configure_spark_sets_the_variable_a_session_started_from_python_reads(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "placeholder")  # restored after the test
    monkeypatch.delenv("PYSPARK_PYTHON")
    configure_spark(SparkSession.builder)
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.delenv("PYSPARK_PYTHON")
    configure_spark(SparkSession.builder.config("spark.pyspark.python", "/opt/py/bin/python3"))
    assert os.environ["PYSPARK_PYTHON"] == "/opt/py/bin/python3"  # the user's choice


class FakeContext:
    """What ``run_executors_on_driver_python`` reads of a SparkContext."""

    def __init__(self, python_exec: str, conf: dict[str, str]) -> None:
        self.pythonExec = python_exec
        self._conf = conf

    def getConf(self) -> FakeContext:  # noqa: N802 - SparkContext's name
        return self

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._conf.get(key, default)


def test_a_running_session_gets_the_driver_python_unless_the_user_chose_one(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "placeholder")
    monkeypatch.delenv("PYSPARK_PYTHON")
    started_before = FakeContext("python3", {})  # PySpark's default: python3 from PATH
    run_executors_on_driver_python(started_before)
    assert started_before.pythonExec == sys.executable
    configured = FakeContext("python3", {"spark.pyspark.python": "/opt/py/bin/python3"})
    run_executors_on_driver_python(configured)
    assert configured.pythonExec == "/opt/py/bin/python3"
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/bin/python3")
    chosen = FakeContext("/env/bin/python3", {"spark.pyspark.python": "/opt/py/bin/python3"})
    run_executors_on_driver_python(chosen)
    assert chosen.pythonExec == "/env/bin/python3"


EXECUTOR_PYTHON_JOB = """
import sys
from pyspark.sql import SparkSession
from sparkside import configure_spark
from tests.spark_settings import suite_conf
target, table = sys.argv[1:3]
# the suite's jars already on the class path (as an offline user's): no Ivy resolve
builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config(map=suite_conf(s3_connector=True)))
spark = configure_spark(builder, warehouse=table).getOrCreate()
from sparkside import Participant  # imported after the session started
participant = Participant(target, pipeline_id="executor-python")
participant.run_batch(spark.range(1), 0,
                      lambda df, batch_id, txn: txn.write(spark.range(5), table))
participant.close()
print("pythonExec", spark.sparkContext.pythonExec)
spark.stop()
# a session the user built without configure_spark, the participant imported before it
import os
os.environ.pop("PYSPARK_PYTHON", None)
plain = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("plain before", plain.sparkContext.pythonExec)
participant = Participant(target, pipeline_id="executor-python-plain")
participant.run_batch(plain.range(1), 0,
                      lambda df, batch_id, txn: txn.write(plain.range(5, 8), table + "-plain"))
participant.close()
print("plain pythonExec", plain.sparkContext.pythonExec)
plain.stop()
"""


def test_executors_run_the_driver_python_when_python3_on_path_lacks_pyarrow(
        daemon_factory, moto_server, s3_env, s3_bucket, tmp_path):  # noqa: ANN001
    root = f"s3://{s3_bucket}/wh"
    daemon = daemon_factory.start(warehouse=root, data_dir=tmp_path / "data",
                                  env=moto_server.env(), name="python")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to("/usr/bin/python3")  # Debian's: no pyarrow, no pyspark
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env.update(moto_server.env(), PATH=f"{bare}:{env['PATH']}", PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run([sys.executable, "-c", EXECUTOR_PYTHON_JOB, daemon.target,
                               f"{root}/numbers"], env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        daemon.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"pythonExec {sys.executable}\n" in done.stdout.splitlines(keepends=True)
    rows = read_delta_table(f"{root}/numbers").column("id").to_pylist()
    assert sorted(rows) == list(range(5))
    assert "plain before python3\n" in done.stdout  # PySpark's default: python3 from PATH
    assert f"plain pythonExec {sys.executable}" in done.stdout
    rows = read_delta_table(f"{root}/numbers-plain").column("id").to_pylist()
    assert sorted(rows) == [5, 6, 7]


def test_the_first_fetch_is_announced_once_and_later_runs_say_nothing(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sessions, "_announced", set())
    ivy = {"spark.jars.ivy": str(tmp_path / "ivy")}
    notice = first_fetch_notice(ivy)
    assert notice is not None
    assert delta_package() in notice and str(tmp_path / "ivy") in notice
    assert "Maven Central" in notice
    builder = SparkSession.builder.config("spark.jars.ivy", str(tmp_path / "ivy"))
    configure_spark(builder)
    configure_spark(builder)
    assert capsys.readouterr().err == notice + "\n"
    group, artifact, version = delta_package().split(":")
    (tmp_path / "ivy" / "jars").mkdir(parents=True)
    (tmp_path / "ivy" / "jars" / f"{group}_{artifact}-{version}.jar").touch()
    assert first_fetch_notice(ivy) is None
    assert first_fetch_notice({"spark.jars.ivySettings": "/etc/ivysettings.xml"}) is None


def test_the_shared_session_runs_delta_spark_without_spark_provided_duplicates(spark):
    assert DELTA_EXTENSION in spark.conf.get("spark.sql.extensions")
    assert spark.conf.get("spark.sql.catalog.spark_catalog") == DELTA_CATALOG
    # the Maven packages Spark resolved, or (tests/spark_settings.suite_conf) the list of them
    # the class archive's maker had Spark resolve and put on the class path
    conf = spark.sparkContext.getConf()
    jars = (conf.get("spark.jars", None) or "").split(",") if conf.contains("spark.jars.packages") \
        else conf.get("spark.driver.extraClassPath").split(os.pathsep)
    group, artifact, version = delta_package().split(":")
    assert any(j.endswith(f"/{group}_{artifact}-{version}.jar") for j in jars), jars
    provided = [j for j in jars for p in SPARK_PROVIDED if f"/{p.replace(':', '_')}-" in j]
    assert not provided, f"jars PySpark already ships were fetched: {provided}"
    assert spark.sparkContext.pythonExec == sys.executable


def test_a_jvm_class_is_found_by_its_full_name_in_one_py4j_lookup(spark, monkeypatch):
    from sparkside.jvm_names import jvm_class

    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    send = client.send_command
    monkeypatch.setattr(client, "send_command", lambda command, *a, **k: (
        sent.append(command), send(command, *a, **k))[1])
    option = jvm_class(spark._jvm, "scala.Option")
    assert len(sent) == 1, sent
    assert option.empty().isEmpty()
    sent.clear()
    spark._jvm.scala.Option  # noqa: B018 - Py4J's walk: a lookup at every dot
    assert len(sent) == 2
