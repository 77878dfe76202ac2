"""Object-store settings and access in one place: every lake function that reads, writes or
deletes on an object store takes its options, filesystem and error wording from here.

Settings come from the standard AWS variables, read from the process environment when used
(cached while they stay the same): ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``), ``AWS_ALLOW_HTTP``; without keys in the environment, from a profile
(``AWS_PROFILE``, else ``default``) of the shared credentials and config files
(``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``, by default under ``~/.aws``): static keys
only, percolake does not run SSO or assume-role flows. Credentials live only in this process's
memory: ``S3Settings`` never shows them (``repr``), error texts are scrubbed of them, and no
record, log line or RPC carries them.

Four clients use them, each for what it does best (measured against moto's server):

- delta-rs (``delta_storage_options``): Delta commits with ``conditional_put=etag``, so a
  commit never overwrites a log entry another writer made (no lock service); bounded retries.
- Arrow's native S3 filesystem (``s3_filesystem``): listing, sizes. It releases the GIL while
  it waits, so the daemon's other threads keep serving.
- botocore's signer on a urllib3 pool (``read_object``): reading a whole object such as a log
  entry in one GET (Arrow's input streams send a HEAD first: two round trips; boto3's client
  spends three times the CPU per request), and boto3 (``s3_client``) for the conditional put
  of a log entry (``If-None-Match: *``).
- delta-rs's object-store handler (``delete_objects``): deletions. Arrow's S3 filesystem
  re-creates a "directory" marker object for the parent of whatever it deletes, which would
  write outside an attempt's prefix; object_store's DELETE writes nothing.

Every call is bounded (``Limits``): an unreachable endpoint fails after a few retries within
seconds with ``StorageUnavailable`` (UNAVAILABLE), a missing bucket or refused access with
``StorageRefused`` (FAILED_PRECONDITION), missing or malformed settings with
``StorageSettingsError`` (FAILED_PRECONDITION) naming the variable to set.
"""

from __future__ import annotations

import configparser
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from percolake.errors import FailedPrecondition, ProtocolError, Unavailable
from percolake.lake.warehouse import is_object_store, split_object_uri
from percolake.parallel import leaf_submit

if TYPE_CHECKING:  # Arrow's filesystems load with the first object-store call
    import pyarrow.fs as pafs

ENV_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
            "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ALLOW_HTTP",
            "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
DEFAULT_REGION = "us-east-1"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NETWORK = ("NETWORK_CONNECTION", "error sending request", "Connection refused", "tcp connect",
            "timed out", "Timeout", "dns error", "Could not connect", "connection closed",
            "Connection reset", "SERVICE_UNAVAILABLE", "503 Service Unavailable",
            "INTERNAL_FAILURE", "500 Internal Server Error", "SlowDown")
_NO_BUCKET = ("NoSuchBucket", "NO_SUCH_BUCKET", "bucket does not exist")
_DENIED = ("AccessDenied", "ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "403 Forbidden", "ExpiredToken", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH")


class StorageSettingsError(FailedPrecondition):
    """The object store's settings are missing or malformed; the message names the variable."""


class StorageRefused(FailedPrecondition):
    """The object store answered, and refused: bucket missing, access denied."""


class StorageUnavailable(Unavailable):
    """The object store did not answer within the bounded retries: try again later."""


@dataclass(frozen=True)
class Limits:
    """Bounds of every object-store call: each request times out after ``timeout_s``
    (connecting after ``connect_timeout_s``) and is retried at most ``max_retries`` times."""

    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    max_retries: int = 3


_limits = Limits()
_lock = threading.Lock()
_settings_cache: dict[tuple, S3Settings] = {}
_fs_cache: dict[tuple, pafs.S3FileSystem] = {}
_client_cache: dict[tuple, Any] = {}
MAX_CONNECTIONS = 32  # a batch's per-table reads run side by side


def configure(timeout_s: float | None = None, max_retries: int | None = None) -> Limits:
    """Sets the process-wide bounds of object-store calls (the daemon's --object-store-timeout);
    returns them."""
    global _limits
    with _lock:
        timeout = _limits.timeout_s if timeout_s is None else float(timeout_s)
        _limits = Limits(timeout, min(_limits.connect_timeout_s, timeout),
                         _limits.max_retries if max_retries is None else int(max_retries))
        _fs_cache.clear()
        _client_cache.clear()
        return _limits


def limits() -> Limits:
    return _limits


@dataclass(frozen=True, repr=False)
class S3Settings:
    """Where and as whom to reach S3. ``repr`` and ``describe`` never show a credential."""

    region: str
    access_key_id: str
    secret_access_key: str
    session_token: str | None
    endpoint_url: str | None  # scheme://host[:port], None for AWS itself
    allow_http: bool
    source: str  # where the credentials came from, e.g. "environment" or "profile 'ci'"

    def __repr__(self) -> str:
        return f"S3Settings({self.describe()})"

    def describe(self) -> str:
        """Endpoint, region and where the credentials came from; no credential."""
        return (f"endpoint {self.endpoint_url or 'AWS S3'}, region {self.region}, credentials "
                f"from {self.source}")

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.secret_access_key, self.session_token) if s)


def s3_settings(environ: Mapping[str, str] | None = None) -> S3Settings:
    """The S3 settings of ``environ`` (default: this process's environment), cached while the
    variables and the profile files stay the same.

    Raises:
        StorageSettingsError: no credentials, half of a key pair, a malformed endpoint, or an
            ``http://`` endpoint without ``AWS_ALLOW_HTTP=true``; the message names the variable.
    """
    env = os.environ if environ is None else environ
    files = _profile_files(env)
    key = tuple(env.get(v) for v in ENV_VARS) + tuple(_stamp(f) for f in files)
    cached = _settings_cache.get(key)
    if cached is not None:
        return cached
    settings = _load_settings(env, files)
    with _lock:
        if len(_settings_cache) > 16:
            _settings_cache.clear()
        _settings_cache[key] = settings
    return settings


def _profile_files(env: Mapping[str, str]) -> tuple[str, str]:
    home = os.path.expanduser("~")
    return (env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
            env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def _read_profile(env: Mapping[str, str], files: tuple[str, str]) -> tuple[str, dict[str, str]]:
    """The profile's name and its values (credentials file over config file); {} if absent."""
    name = env.get("AWS_PROFILE") or "default"
    credentials_file, config_file = files
    values: dict[str, str] = {}
    found = False
    for path, section in ((config_file, "default" if name == "default" else f"profile {name}"),
                          (credentials_file, name)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except configparser.Error as exc:
            raise StorageSettingsError(f"cannot read the AWS profile file {path}: "
                                       f"{type(exc).__name__}") from None
        if parser.has_section(section):
            found = True
            values.update({k.lower(): v.strip() for k, v in parser.items(section)})
    if env.get("AWS_PROFILE") and not found:
        raise StorageSettingsError(
            f"AWS_PROFILE={name!r}: no such profile in {credentials_file} or {config_file} "
            "(AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE)")
    return name, values


def _load_settings(env: Mapping[str, str], files: tuple[str, str]) -> S3Settings:
    key_id = env.get("AWS_ACCESS_KEY_ID") or ""
    secret = env.get("AWS_SECRET_ACCESS_KEY") or ""
    token = env.get("AWS_SESSION_TOKEN") or None
    if bool(key_id) != bool(secret):
        missing = "AWS_SECRET_ACCESS_KEY" if key_id else "AWS_ACCESS_KEY_ID"
        present = "AWS_ACCESS_KEY_ID" if key_id else "AWS_SECRET_ACCESS_KEY"
        raise StorageSettingsError(f"S3 credentials: {present} is set but {missing} is not; "
                                   "set both")
    try:
        profile_name, profile = _read_profile(env, files)
    except StorageSettingsError:
        if not key_id:
            raise
        profile_name, profile = env.get("AWS_PROFILE") or "default", {}
    if key_id:
        source = "environment (AWS_ACCESS_KEY_ID)"
    elif profile.get("aws_access_key_id") and profile.get("aws_secret_access_key"):
        key_id, secret = profile["aws_access_key_id"], profile["aws_secret_access_key"]
        token = profile.get("aws_session_token") or None
        source = f"profile {profile_name!r}"
    elif env.get("AWS_PROFILE"):
        raise StorageSettingsError(
            f"AWS_PROFILE={profile_name!r} has no aws_access_key_id and aws_secret_access_key "
            "(percolake reads static keys only; for SSO or assume-role profiles export "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN)")
    else:
        raise StorageSettingsError(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
            "AWS_SESSION_TOKEN for temporary credentials), or AWS_PROFILE naming a profile "
            "with static keys")
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region")
              or DEFAULT_REGION)
    endpoint_var = next((v for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(v)),
                        None)
    endpoint = env.get(endpoint_var) if endpoint_var else profile.get("endpoint_url")
    endpoint_var = endpoint_var or f"endpoint_url of profile {profile_name!r}"
    allow_http = (env.get("AWS_ALLOW_HTTP") or "").strip().lower() in ("true", "1", "yes")
    if endpoint:
        endpoint = _check_endpoint(endpoint, endpoint_var)
        if endpoint.startswith("http://") and not allow_http:
            raise StorageSettingsError(
                f"{endpoint_var} is a plain-http endpoint ({endpoint}); set AWS_ALLOW_HTTP=true "
                "to allow unencrypted traffic, or use https")
    return S3Settings(region, key_id, secret, token, endpoint or None, allow_http, source)


def _check_endpoint(endpoint: str, variable: str) -> str:
    try:
        parts = urlsplit(endpoint.strip())
        port = parts.port
    except ValueError:
        raise StorageSettingsError(f"{variable} is not a URL: {endpoint!r}") from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.username
            or parts.password or parts.query or parts.fragment or parts.path not in ("", "/")):
        raise StorageSettingsError(
            f"{variable} must be http(s)://host[:port] without user, path or query; got "
            f"{parts.scheme}://{parts.hostname or ''}{parts.path}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}"


def check_settings(uris: Iterable[str]) -> None:
    """Loads the settings every object-store URI of ``uris`` needs (the daemon's start).

    Raises:
        StorageSettingsError: naming the variable to set.
    """
    if any(is_object_store(u) for u in uris):
        s3_settings()


def delta_storage_options(uri: str) -> dict[str, str]:
    """delta-rs's ``storage_options`` for a table: {} for a local one."""
    if not is_object_store(uri):
        return {}
    settings = s3_settings()
    bounds = _limits
    options = {
        "AWS_ACCESS_KEY_ID": settings.access_key_id,
        "AWS_SECRET_ACCESS_KEY": settings.secret_access_key,
        "AWS_REGION": settings.region,
        # a commit is a put-if-absent of the next log entry (ETag conditions): a concurrent
        # writer makes ours fail, never overwritten; no lock service (DynamoDB) needed
        "conditional_put": "etag",
        "timeout": f"{int(bounds.timeout_s * 1000)}ms",
        "connect_timeout": f"{int(bounds.connect_timeout_s * 1000)}ms",
        "max_retries": str(bounds.max_retries),
        "retry_timeout": f"{int(bounds.timeout_s * 1000)}ms",
    }
    if settings.session_token:
        options["AWS_SESSION_TOKEN"] = settings.session_token
    if settings.endpoint_url:
        options["AWS_ENDPOINT_URL"] = settings.endpoint_url
    if settings.allow_http:
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def s3_filesystem(settings: S3Settings | None = None,
                  bounds: Limits | None = None) -> pafs.S3FileSystem:
    """Arrow's native S3 filesystem with ``settings`` and ``bounds`` (default: the current
    ones; cached). Spark's executors pass the driver's, which their tasks carry."""
    import pyarrow.fs as pafs

    settings = settings or s3_settings()
    bounds = bounds or _limits
    key = (settings, bounds)
    with _lock:
        cached = _fs_cache.get(key)
        if cached is not None:
            return cached
    endpoint = urlsplit(settings.endpoint_url) if settings.endpoint_url else None
    filesystem = pafs.S3FileSystem(
        access_key=settings.access_key_id, secret_key=settings.secret_access_key,
        session_token=settings.session_token, region=settings.region,
        scheme=endpoint.scheme if endpoint else "https",
        endpoint_override=endpoint.netloc if endpoint else None,
        request_timeout=bounds.timeout_s, connect_timeout=bounds.connect_timeout_s,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=bounds.max_retries),
        allow_bucket_creation=False, allow_bucket_deletion=False,
        # a small object is one PUT when its stream closes, not a multipart upload (3 requests)
        allow_delayed_open=True)
    with _lock:
        if len(_fs_cache) > 4:
            _fs_cache.clear()
        _fs_cache[key] = filesystem
    return filesystem


def s3_client(settings: S3Settings | None = None, bounds: Limits | None = None) -> Any:
    """A boto3 S3 client with ``settings`` and ``bounds`` (default: the current ones; cached,
    thread-safe): for what Arrow's filesystem cannot do in one request, a conditional put and a
    GET without a HEAD before it."""
    import boto3
    import botocore.config

    settings = settings or s3_settings()
    bounds = bounds or _limits
    key = (settings, bounds)
    with _lock:
        cached = _client_cache.get(key)
        if cached is not None:
            return cached
    client = boto3.client(
        "s3", region_name=settings.region, endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
        config=botocore.config.Config(
            connect_timeout=bounds.connect_timeout_s, read_timeout=bounds.timeout_s,
            retries={"max_attempts": bounds.max_retries, "mode": "standard"},
            max_pool_connections=MAX_CONNECTIONS,
            s3={"addressing_style": "path"} if settings.endpoint_url else None))
    with _lock:
        if len(_client_cache) > 4:
            _client_cache.clear()
        _client_cache[key] = client
    return client


def arrow_path(uri: str) -> str:
    """``bucket/key`` of an object-store URI: the path Arrow's S3 filesystem takes."""
    _, bucket, key = split_object_uri(uri)
    return f"{bucket}/{key}".rstrip("/")


def hadoop_s3a_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` settings equal to this module's (for the Spark side): the
    same endpoint, region and credentials, path-style access with a custom endpoint. They hold
    the credentials: set them on the SparkSession, never log them."""
    settings = s3_settings(environ)
    prefix = "spark.hadoop.fs.s3a."
    options = {
        f"{prefix}access.key": settings.access_key_id,
        f"{prefix}secret.key": settings.secret_access_key,
        f"{prefix}endpoint.region": settings.region,
    }
    if settings.session_token:
        options[f"{prefix}session.token"] = settings.session_token
        options[f"{prefix}aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
    else:
        options[f"{prefix}aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")
    if settings.endpoint_url:
        options[f"{prefix}endpoint"] = settings.endpoint_url
        options[f"{prefix}path.style.access"] = "true"
        options[f"{prefix}connection.ssl.enabled"] = str(
            settings.endpoint_url.startswith("https://")).lower()
    return options


# ---------------------------------------------------------------- errors


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` without terminal colours and without ``secrets`` (default: every credential of
    the current settings)."""
    text = _ANSI.sub("", text)
    if secrets is None:
        try:
            secrets = s3_settings().secrets
        except ProtocolError:
            secrets = ()
    for secret in secrets:
        if len(secret) >= 8:  # real ones are 40+ characters; never mangle a message for less
            text = text.replace(secret, "<redacted>")
    return text


def _summary(text: str, limit: int = 300) -> str:
    text = " ".join(scrub(text).replace("↳", " ").split())
    return text if len(text) <= limit else text[:limit] + "..."


def storage_error(exc: BaseException, uri: str, doing: str) -> ProtocolError:
    """A clear, credential-free error for a failed object-store call on ``uri``.

    ``doing`` completes "cannot ...", e.g. "read the Delta log of".
    """
    if isinstance(exc, ProtocolError):
        return exc
    text = scrub(str(exc))
    _, bucket, _ = split_object_uri(uri)
    try:
        where = s3_settings().describe()
    except StorageSettingsError as settings_error:
        return settings_error
    if any(marker in text for marker in _NO_BUCKET):
        return StorageRefused(f"cannot {doing} {uri}: bucket {bucket!r} does not exist "
                              f"({where})")
    if any(marker in text for marker in _DENIED):
        return StorageRefused(f"cannot {doing} {uri}: access denied ({where}): "
                              f"{_summary(text, 200)}")
    bounds = _limits
    if any(marker in text for marker in _NETWORK):
        return StorageUnavailable(
            f"cannot {doing} {uri}: the object store did not answer ({where}; gave up after "
            f"at most {bounds.max_retries} retries, {bounds.timeout_s:g} s per request): "
            f"{_summary(text, 200)}")
    return StorageUnavailable(f"cannot {doing} {uri} ({where}): {type(exc).__name__}: "
                              f"{_summary(text)}")


# ---------------------------------------------------------------- object access (Arrow)


def read_object(uri: str) -> bytes | None:
    """The whole object at ``uri`` (a Delta log entry: small), None if there is none: one GET
    (Arrow's input streams ask for the size with a HEAD first, a second round trip). Signed
    with botocore's signer and sent on a urllib3 pool: a third of boto3's CPU per request.

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError.
    """
    import urllib3

    settings, bounds = s3_settings(), _limits
    _, bucket, key = split_object_uri(uri)
    url = _object_url(settings, bucket, key)
    try:
        reply = _http_pool(settings, bounds).request(
            "GET", url, headers=_signed_headers(settings, "GET", url),
            retries=urllib3.Retry(total=bounds.max_retries, backoff_factor=0.1,
                                  status_forcelist=RETRIED_STATUSES, raise_on_status=False),
            timeout=urllib3.Timeout(connect=bounds.connect_timeout_s, read=bounds.timeout_s))
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise storage_error(exc, uri, "read") from None
    if reply.status == 200:
        return reply.data
    code = _error_code(reply.data)
    if reply.status == 404 and code != "NoSuchBucket":
        return None
    raise storage_error(ObjectStoreAnswer(f"{reply.status} {reply.reason} ({code}): "
                                          f"{reply.data[:300].decode(errors='replace')}"),
                        uri, "read") from None


class ObjectStoreAnswer(Exception):
    """An object store's error answer (status, reason, its error code and text)."""


RETRIED_STATUSES = (500, 502, 503, 504)  # as boto3's standard retry mode: transient


def _object_url(settings: S3Settings, bucket: str, key: str) -> str:
    """The path-style URL of an object (with a custom endpoint, as the other clients use it),
    its key percent-encoded as SigV4 signs it."""
    path = f"/{bucket}/{quote(key, safe='/~')}"
    if settings.endpoint_url:
        return f"{settings.endpoint_url.rstrip('/')}{path}"
    return f"https://s3.{settings.region}.amazonaws.com{path}"


def _signed_headers(settings: S3Settings, method: str, url: str) -> dict[str, str]:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url)
    S3SigV4Auth(Credentials(settings.access_key_id, settings.secret_access_key,
                            settings.session_token), "s3", settings.region).add_auth(request)
    return dict(request.headers.items())


def _http_pool(settings: S3Settings, bounds: Limits) -> Any:
    """A urllib3 connection pool for ``settings``' endpoint (cached, thread-safe)."""
    import urllib3

    key = ("http", settings, bounds)
    with _lock:
        cached = _client_cache.get(key)
        if cached is None:
            cached = _client_cache[key] = urllib3.PoolManager(maxsize=MAX_CONNECTIONS)
    return cached


def _error_code(body: bytes) -> str:
    match = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return match.group(1).decode(errors="replace") if match else ""


def read_objects(uris: Sequence[str]) -> list[bytes | None]:
    """``read_object`` of each of ``uris``, all at once (one round trip for all), in order.

    Raises:
        the first error of ``read_object`` in the order of ``uris``.
    """
    if len(uris) <= 1:
        return [read_object(uri) for uri in uris]
    return [future.result() for future in [leaf_submit(read_object, uri) for uri in uris]]


def list_files(prefix_uri: str) -> dict[str, tuple[int, int | None]]:
    """Every object below ``prefix_uri`` + ``/`` (recursively), as its path relative to the
    prefix -> (size, modification time in ns). Listing only: nothing is downloaded.

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError.
    """
    import pyarrow.fs as pafs

    base = arrow_path(prefix_uri)
    try:
        infos = s3_filesystem().get_file_info(
            pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise storage_error(exc, prefix_uri, "list the objects below") from None
    found: dict[str, tuple[int, int | None]] = {}
    for info in infos:
        if info.type.name == "File" and info.path.startswith(base + "/"):
            found[info.path[len(base) + 1:]] = (info.size, info.mtime_ns)
    return found


def _file_info(path: str, uri: str, doing: str) -> Any:
    """Arrow's file info of ``path`` (one HEAD); its type's name says what is there
    (``File``, ``Directory``, ``NotFound``)."""
    try:
        return s3_filesystem().get_file_info(path)
    except OSError as exc:
        raise storage_error(exc, uri, doing) from None


def object_size(uri: str) -> int | None:
    """The size of the object at ``uri`` (one HEAD), None if there is none."""
    info = _file_info(arrow_path(uri), uri, "look up")
    return info.size if info.type.name == "File" else None


def prefix_exists(uri: str) -> bool:
    """Whether any object lies below ``uri`` + ``/`` (one HEAD and one short LIST)."""
    return _file_info(arrow_path(uri), uri, "look up").type.name != "NotFound"


def bucket_exists(uri: str) -> bool:
    """Whether the bucket of ``uri`` exists (one HEAD of the bucket)."""
    _, bucket, _ = split_object_uri(uri)
    return _file_info(bucket, uri, "look up the bucket of").type.name != "NotFound"


def missing_bucket_error(uri: str, doing: str) -> StorageRefused | None:
    """A StorageRefused naming the bucket when the bucket of ``uri`` does not exist."""
    if bucket_exists(uri):
        return None
    _, bucket, _ = split_object_uri(uri)
    return StorageRefused(f"cannot {doing} {uri}: bucket {bucket!r} does not exist "
                          f"({s3_settings().describe()})")


def probe(uri: str) -> str | None:
    """Why the object store of ``uri`` cannot be used now, None if its bucket answers."""
    try:
        error = missing_bucket_error(uri, "use the warehouse root")
    except ProtocolError as exc:
        return str(exc)
    return str(error) if error else None


# ---------------------------------------------------------------- deletion (object_store)


def delete_objects(prefix_uri: str, relative_paths: Iterable[str]) -> None:
    """Deletes the objects ``prefix_uri/<relative path>``, one DELETE each; a missing one is
    fine. Writes nothing (no directory markers).

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError.
    """
    from deltalake.fs import DeltaStorageHandler

    handler = DeltaStorageHandler(prefix_uri, options=delta_storage_options(prefix_uri))
    for path in relative_paths:
        try:
            handler.delete_file(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(exc, f"{prefix_uri}/{path}", "delete") from None


# ---------------------------------------------------------------- conditional writes (boto3)


def put_object_if_absent(uri: str, data: bytes) -> bool:
    """Writes the object at ``uri`` only if none exists (``If-None-Match: *``, the conditional
    put delta-rs commits with); False when one exists already (a concurrent writer won).

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError.
    """
    import botocore.exceptions

    _, bucket, key = split_object_uri(uri)
    client = s3_client()
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except botocore.exceptions.ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status in (409, 412):  # exists, or a concurrent conditional write in flight
            return False
        raise storage_error(exc, uri, "write") from None
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        raise storage_error(exc, uri, "write") from None
    return True
