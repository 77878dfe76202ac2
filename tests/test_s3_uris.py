"""Object-store table names and settings, without a server: ``s3://`` and ``s3a://`` name one
table with one canonical name (a fixed point, one name per object prefix), confinement below
the warehouse roots is as strict as for local paths, local and S3 roots mix; the S3 settings
come from the AWS variables or a profile, name the variable that is missing, and never show a
credential."""

from __future__ import annotations

import itertools
import re

import pytest

from percolake.errors import InvalidArgument, PermissionDenied
from percolake.lake import storage
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.warehouse import (
    OBJECT_STORES,
    UnsafeLocation,
    Warehouse,
    canonical_table_uri,
    check_table_location,
    delta_uri,
    local_path,
    spark_uri,
    write_location,
)

B = "lake-bucket"


def test_s3a_and_other_spellings_name_the_same_table():
    spellings = [f"s3://{B}/wh/t", f"s3a://{B}/wh/t", f"S3://{B}/wh/t", f"S3A://{B}/wh/t/",
                 f"s3://{B}/wh/t//", f"s3://{B}/wh/%74", f"s3a://{B}/%77h/t"]
    assert {canonical_table_uri(s) for s in spellings} == {f"s3://{B}/wh/t"}
    assert {Warehouse([f"s3a://{B}/wh"]).resolve(s) for s in spellings} == {f"s3://{B}/wh/t"}


def test_what_delta_rs_and_spark_open():
    table = canonical_table_uri(f"s3a://{B}/wh/t")
    assert delta_uri(table) == f"s3://{B}/wh/t"
    assert spark_uri(table) == f"s3a://{B}/wh/t"
    assert spark_uri(write_location(table, "abc")) == f"s3a://{B}/wh/t/_percolake/abc"
    assert delta_uri("file:///wh/t") == spark_uri("file:///wh/t") == "/wh/t"
    with pytest.raises(InvalidArgument, match="object-store table"):
        local_path(table)


SEGMENTS = ["a", "A", "0", "a.b", "a_b", "a-b", "a~b", ".a", "a.", "...", "_percolake2",
            "%61", "%41", "%2E", "%7E"]


def test_canonicalisation_is_a_fixed_point_with_one_name_per_prefix_over_a_corpus():
    """Every spelling of every two-segment prefix either is refused or gets a name that
    canonicalises to itself, and different prefixes (as the store sees keys) get different
    names: the decoded key is the name's key, byte for byte."""
    names_of: dict[str, set[str]] = {}
    for a, b in itertools.product(SEGMENTS, repeat=2):
        for scheme, tail in itertools.product(("s3", "s3a", "S3"), ("", "/")):
            spelling = f"{scheme}://{B}/wh/{a}/{b}{tail}"
            try:
                name = canonical_table_uri(spelling)
            except InvalidArgument:
                assert re.fullmatch(r"\.+|%2E", a) or re.fullmatch(r"\.+|%2E", b) or (
                    "..." in (a, b)), spelling
                continue
            assert canonical_table_uri(name) == name, spelling
            assert "%" not in name and name.startswith(f"s3://{B}/wh/")
            key = name.removeprefix(f"s3://{B}/")
            names_of.setdefault(key, set()).add(name)
    assert all(len(names) == 1 for names in names_of.values())
    assert "wh/a/A" in names_of and "wh/A/a" in names_of  # keys are case-sensitive


@pytest.mark.parametrize(("spelling", "words"), [
    (f"s3://{B}/wh/../t", "'..'"),
    (f"s3://{B}/wh/%2E%2E/t", "'..'"),
    (f"s3://{B}/wh/%2e%2E/t", "'..'"),
    (f"s3://{B}/wh/./t", "'.'"),
    (f"s3://{B}/wh/t/%2F/x", "encoded '/'"),
    (f"s3://{B}/wh/t%00", "NUL"),
    (f"s3://{B}/wh/t%zz", "escape"),
    (f"s3://{B}/wh/%FF", "UTF-8"),
    (f"s3://{B}/wh//t", "empty segment"),
    (f"s3://{B}/wh/t?x=1", "query"),
    (f"s3://{B}/wh/t#f", "fragment"),
    (f"s3://{B}:443/wh/t", "bucket name"),
    ("s3://Upper-Bucket/wh/t", "bucket name"),
    ("s3://ab/wh/t", "bucket name"),
    ("s3:///wh/t", "bucket name"),
    (f"s3://{B}/wh/a b", "not allowed"),
    (f"s3://{B}/wh/a%20b", "not allowed"),
    (f"s3://{B}/wh/a+b", "not allowed"),
    (f"s3://{B}/wh/é", "not allowed"),
    (f"s3://{B}/" + "k" * 800, "longer"),
    (f"gs://{B}/wh/t", "not supported"),
    ("abfss://c@a.dfs.core.windows.net/wh/t", "not supported"),
])
def test_names_that_cannot_be_represented_are_refused(spelling, words):
    with pytest.raises(InvalidArgument, match=re.escape(words)):
        Warehouse([f"s3://{B}"]).resolve(spelling)


def test_user_information_is_refused_without_repeating_it():
    for spelling in (f"s3://AKIA:topsecret@{B}/wh/t", f"s3a://topsecret@{B}/wh/t"):
        with pytest.raises(InvalidArgument) as caught:
            Warehouse([f"s3://{B}/wh"]).resolve(spelling)
        assert "user information" in str(caught.value)
        assert "topsecret" not in str(caught.value)


def test_confinement_below_s3_roots_and_mixed_with_local_roots(tmp_path):
    warehouse = Warehouse([str(tmp_path), f"s3a://{B}/wh", f"s3://{B}-2"])
    assert warehouse.roots == [f"file://{tmp_path}", f"s3://{B}/wh", f"s3://{B}-2"]
    assert warehouse.resolve(f"{tmp_path}/t") == f"file://{tmp_path}/t"
    assert warehouse.resolve(f"s3a://{B}/wh/t") == f"s3://{B}/wh/t"
    assert warehouse.resolve(f"s3://{B}-2/any/where") == f"s3://{B}-2/any/where"
    for outside in (f"s3://{B}/wh", f"s3://{B}/wh2/t", f"s3://{B}/w", f"s3://{B}/t",
                    f"s3://{B}-3/wh/t", f"s3://{B}-2", "/elsewhere/t"):
        with pytest.raises(PermissionDenied):
            warehouse.resolve(outside)
    for inside_attempt in (f"s3://{B}/wh/t/_percolake/x", f"s3://{B}/wh/t/%5Fpercolake/x",
                           f"s3://{B}-2/_percolake/t", f"s3a://{B}/wh/_percolake"):
        with pytest.raises(InvalidArgument, match="_percolake"):
            warehouse.resolve(inside_attempt)
    with pytest.raises(PermissionDenied, match="no warehouse root"):
        Warehouse([]).resolve(f"s3://{B}/wh/t")


def test_the_apply_checks_an_s3_table_name_against_the_roots():
    check_table_location(f"s3://{B}/wh/t", [f"s3a://{B}/wh"])
    check_table_location(f"s3://{B}/wh/t")
    for table, roots in [(f"s3://{B}/wh/t", [f"s3://{B}/other"]),
                         (f"s3://{B}/wh/t", ["/wh"]),
                         (f"s3a://{B}/wh/t", None),
                         (f"s3://{B}/wh/_percolake/x/t", [f"s3://{B}/wh"]),
                         (f"s3://{B}/wh/../t", None)]:
        with pytest.raises(UnsafeLocation):
            check_table_location(table, roots)


def test_cleanup_refuses_an_s3_location_before_any_request(monkeypatch):
    monkeypatch.setattr(storage, "list_files", lambda *a: pytest.fail("listed"))
    for location in (f"s3://{B}/wh/t", f"s3://{B}/wh/t/_percolake",
                     f"s3://{B}/wh/t/_percolake/x/_percolake/y", f"s3://{B}/x/_percolake/y",
                     f"s3://{B}/wh/t/%2E%2E/_percolake/y", f"s3://{B}/wh/t/_percolake/x?y"):
        with pytest.raises(UnsafeLocation):
            remove_attempt_files(location, roots=[f"s3://{B}/wh"])


def test_the_scheme_table_is_one_row_per_store():
    assert set(OBJECT_STORES) == {"s3"}
    s3 = OBJECT_STORES["s3"]
    assert (s3.scheme, s3.aliases, s3.hadoop_scheme) == ("s3", ("s3a",), "s3a")


# ---------------------------------------------------------------- settings and secrets

ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
       "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
       "AWS_ALLOW_HTTP": "true"}


@pytest.fixture
def no_profile(tmp_path):
    return {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}


def test_settings_from_the_environment_never_show_the_secret(no_profile):
    settings = storage.s3_settings({**ENV, **no_profile, "AWS_SESSION_TOKEN": "tok-12345678"})
    assert (settings.region, settings.endpoint_url, settings.allow_http) == (
        "eu-west-1", "http://127.0.0.1:9000", True)
    for shown in (repr(settings), str(settings), settings.describe()):
        assert "wJalrXUtnFEMI" not in shown and "tok-12345678" not in shown
        assert "127.0.0.1:9000" in shown


@pytest.mark.parametrize(("drop", "named"), [
    (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "AWS_ACCESS_KEY_ID"),
    (("AWS_SECRET_ACCESS_KEY",), "AWS_SECRET_ACCESS_KEY"),
    (("AWS_ACCESS_KEY_ID",), "AWS_ACCESS_KEY_ID is not"),
    (("AWS_ALLOW_HTTP",), "AWS_ALLOW_HTTP"),
])
def test_missing_settings_name_the_variable(no_profile, drop, named):
    env = {k: v for k, v in {**ENV, **no_profile}.items() if k not in drop}
    with pytest.raises(storage.StorageSettingsError, match=named):
        storage.s3_settings(env)


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9000", "ftp://host", "http://u:p@host",
                                      "http://host/path", "http://host:99999"])
def test_a_malformed_endpoint_names_the_variable(no_profile, endpoint):
    with pytest.raises(storage.StorageSettingsError, match="AWS_ENDPOINT_URL"):
        storage.s3_settings({**ENV, **no_profile, "AWS_ENDPOINT_URL": endpoint})


def test_settings_from_a_profile(tmp_path):
    (tmp_path / "credentials").write_text(
        "[ci]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = profile-secret-1\n")
    (tmp_path / "config").write_text("[profile ci]\nregion = ap-south-1\n"
                                     "endpoint_url = https://s3.example.test\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
             "AWS_CONFIG_FILE": str(tmp_path / "config")}
    settings = storage.s3_settings({**files, "AWS_PROFILE": "ci"})
    assert (settings.access_key_id, settings.region, settings.endpoint_url) == (
        "AKIDPROFILE", "ap-south-1", "https://s3.example.test")
    assert "profile 'ci'" in settings.describe() and "profile-secret-1" not in repr(settings)
    with pytest.raises(storage.StorageSettingsError, match="AWS_PROFILE='nope'"):
        storage.s3_settings({**files, "AWS_PROFILE": "nope"})
    # the environment's keys come first
    assert storage.s3_settings({**files, "AWS_PROFILE": "ci", "AWS_ACCESS_KEY_ID": "E",
                                "AWS_SECRET_ACCESS_KEY": "S"}).access_key_id == "E"


def test_delta_options_use_conditional_put_and_bounded_retries(monkeypatch, no_profile):
    for name, value in {**ENV, **no_profile}.items():
        monkeypatch.setenv(name, value)
    options = storage.delta_storage_options(f"s3://{B}/wh/t")
    assert options["conditional_put"] == "etag"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["max_retries"] == "3"
    assert storage.delta_storage_options("file:///wh/t") == {}
    hadoop = storage.hadoop_s3a_options()
    assert hadoop["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert hadoop["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert hadoop["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"


def test_error_texts_are_scrubbed_of_credentials(monkeypatch, no_profile):
    for name, value in {**ENV, **no_profile}.items():
        monkeypatch.setenv(name, value)
    error = storage.storage_error(OSError(f"boom {ENV['AWS_SECRET_ACCESS_KEY']} Connection "
                                          "refused"), f"s3://{B}/wh/t", "read")
    assert isinstance(error, storage.StorageUnavailable)
    assert ENV["AWS_SECRET_ACCESS_KEY"] not in str(error) and "<redacted>" in str(error)
    missing = storage.storage_error(OSError("404 <Code>NoSuchBucket</Code>"), f"s3://{B}/t",
                                    "read")
    assert isinstance(missing, storage.StorageRefused) and f"bucket '{B}'" in str(missing)
