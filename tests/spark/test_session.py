"""``sparkside.configure_spark``: what it adds to a builder, what it keeps, what it says.

The builder tests only read the builder's settings (no session is started); the last test
checks the shared session the fixtures built with it.
"""

from __future__ import annotations

import importlib.metadata
import sys

import pyspark
import pytest
from pyspark.sql import SparkSession

from percolake.lake.storage import StorageSettingsError
from sparkside import configure_spark
from sparkside import session as sessions
from sparkside.session import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    S3_CONNECTOR,
    SPARK_PROVIDED,
    delta_package,
    first_fetch_notice,
)

pytestmark = pytest.mark.spark


def options(builder: SparkSession.Builder) -> dict[str, str]:
    return {k: str(v) for k, v in builder._options.items()}


def test_the_delta_jar_matches_the_installed_delta_spark_and_pyspark():
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert delta_package() == (f"io.delta:delta-spark_{spark_minor}_2.13:"
                               f"{importlib.metadata.version('delta-spark')}")


def test_configure_spark_adds_delta_spark_and_this_interpreter(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    got = options(configure_spark(SparkSession.builder))
    assert got["spark.jars.packages"] == delta_package()
    assert got["spark.jars.excludes"].split(",") == list(SPARK_PROVIDED)
    assert got["spark.sql.extensions"] == DELTA_EXTENSION
    assert got["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG
    assert got["spark.pyspark.python"] == sys.executable


def test_configure_spark_keeps_the_users_settings_and_is_idempotent(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
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
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    group, artifact, version = delta_package().split(":")
    assert any(j.endswith(f"/{group}_{artifact}-{version}.jar") for j in jars), jars
    provided = [j for j in jars for p in SPARK_PROVIDED if f"/{p.replace(':', '_')}-" in j]
    assert not provided, f"jars PySpark already ships were fetched: {provided}"
    assert spark.sparkContext.pythonExec == sys.executable
