"""The S3 API server of the object-store tests: moto's S3 application on werkzeug's threaded
server (as moto's ``ThreadedMotoServer``) on 127.0.0.1 and a free port, in a child process of
its own; its conditional writes are decided one at a time, as S3 decides them
(``ConditionalWritesOneAtATime``).

Why a child process: some delta-rs calls (``DeltaTable.is_deltatable``, the object-store
handler's listing) hold the GIL while they wait for the store, so a server thread in the same
interpreter would never answer them (measured: a deadlock). The child exits when its standard
input closes, so it never outlives the test session, even after a crash of pytest.

``MotoServer.env()`` is the environment a process needs to use the server (the standard AWS
variables, plus ``AWS_EC2_METADATA_DISABLED`` so that no SDK ever looks for an instance role
off this machine). The secret key is new for each session, so tests can look for it in logs
and stores. Only 127.0.0.1 is ever contacted.

``MotoServer(iam=True)`` is a server that enforces IAM, as AWS does: it is set up with an
admin user (allowed everything; ``env()``, ``client`` and ``filesystem()`` use its keys), then
every request must be signed by a user of its IAM and be allowed by that user's policies
(``create_user``, ``set_user_policy``). moto turns this on for the whole server (its
``/moto-api/reset-auth`` switch, the server-mode form of ``INITIAL_NO_AUTH_ACTION_COUNT``), so an
IAM server is a separate instance from the session's shared one. ``extra_env`` adds variables to
the child's environment (moto reads its settings from there).

``FlakyEndpoint`` is a relay in front of a server that goes down in the middle of a write (an
endpoint that stops answering while the executors write).

Run as a module (``python -m tests.s3_support``) it is the child: it prints its port and
serves until its standard input closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
ACCESS_KEY_ID = "percolake-test-key"
# A port nothing listens on: connections are refused at once (used for "unreachable").
CLOSED_PORT = 9
ADMIN_USER = "percolake-admin"
ALLOW_EVERYTHING = {"Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def end_child(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Ends a child that serves until its standard input closes: closes it, waits, kills it
    after ``timeout_s``."""
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class S3ApiServer:
    """What every S3 API server of the tests offers (moto's, SeaweedFS's): its endpoint, the
    environment that reaches it, and the tests' own access (buckets, keys, Arrow's
    filesystem). ``name`` says which server it is."""

    name = "s3"

    def __init__(self) -> None:
        self.secret = f"percolake-test-secret-{uuid.uuid4().hex}"
        self.access_key_id = ACCESS_KEY_ID
        self.port = 0
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **overrides: str) -> dict[str, str]:
        """The variables a process needs to reach this server as the test user."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
            **overrides,
        }

    # ------------------------------------------------------------ the test's own access

    @property
    def client(self) -> Any:
        """A boto3 S3 client of this server (the tests' administration: buckets, keys)."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint, region_name=REGION,
                aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret)
        return self._client

    def filesystem(self) -> Any:
        """Arrow's S3 filesystem on this server: how the tests write data files, as an
        executor writing Arrow batches would."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=self.access_key_id, secret_key=self.secret,
                                 region=REGION, scheme="http",
                                 endpoint_override=f"127.0.0.1:{self.port}")

    def create_bucket(self, prefix: str = "pl") -> str:
        """A new, empty bucket with a name nobody else uses."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key of ``bucket`` under ``prefix``, sorted."""
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                          Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(keys)

    def put(self, bucket: str, key: str, body: bytes = b"x") -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body)


class MotoServer(S3ApiServer):
    """moto's S3 API server in a child process; ``start``, use, ``stop``."""

    name = "moto"

    def __init__(self, log_path: Path | None = None, *,
                 extra_env: Mapping[str, str] | None = None, iam: bool = False) -> None:
        super().__init__()  # an IAM server replaces the keys with its admin's
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.iam = iam
        self.process: subprocess.Popen[bytes] | None = None
        self._iam_client: Any = None

    def start(self, timeout_s: float = 60.0) -> MotoServer:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])), **self.extra_env}
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_support"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        if log is not subprocess.DEVNULL:
            log.close()
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"moto's server did not start within {timeout_s} s "
                               f"(exit status {self.process.poll()}); is moto[server] installed?"
                               " (pip install -e '.[dev]')")
        self.port = int(line)
        if self.iam:
            self._enforce_iam()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None:
            return
        end_child(self.process, timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()

    # ------------------------------------------------------------ IAM (``iam=True``)

    @property
    def iam_client(self) -> Any:
        """A boto3 IAM client of this server, as the admin (``iam=True``: users, policies)."""
        if self._iam_client is None:
            import boto3

            self._iam_client = boto3.client(
                "iam", endpoint_url=self.endpoint, region_name=REGION,
                aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret)
        return self._iam_client

    def create_user(self, name: str, policy: Mapping[str, Any]) -> tuple[str, str]:
        """An IAM user whose only permissions are ``policy`` (an IAM policy document);
        returns its access key id and secret key."""
        self.iam_client.create_user(UserName=name)
        self.set_user_policy(name, policy)
        key = self.iam_client.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def set_user_policy(self, name: str, policy: Mapping[str, Any]) -> None:
        """Replaces the user's permissions by ``policy`` (effective at the next request)."""
        self.iam_client.put_user_policy(UserName=name, PolicyName="percolake-test",
                                        PolicyDocument=json.dumps(policy))

    def _enforce_iam(self) -> None:
        """Creates the admin user while requests are not checked yet, takes its keys, then has
        moto check every later request against IAM."""
        key_id, secret = self.create_user(ADMIN_USER, ALLOW_EVERYTHING)
        self.access_key_id, self.secret = key_id, secret
        self._client = self._iam_client = None
        # text/plain: with urllib's default form type, Flask would keep the body from moto
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0",
                                         headers={"Content-Type": "text/plain"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - 127.0.0.1
            answer = json.loads(reply.read())
        if answer.get("status") != "ok":
            raise RuntimeError(f"moto did not turn IAM checks on: {answer}")


class FlakyEndpoint:
    """A TCP relay on 127.0.0.1 in front of an S3 endpoint that goes away in the middle of a
    write: once ``arm()``-ed, the first request that writes (``PUT``, ``POST``) makes it drop
    every connection, that one first (so the write never reaches the store), and stop
    listening: from then on connections are refused, as for a store that went down. ``restore()``
    listens on the same port again. Requests are relayed byte for byte, never answered here."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = 0
        self.went_down = threading.Event()
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FlakyEndpoint:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
            self.went_down.clear()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def arm(self) -> None:
        """Go down at the next write request."""
        self._armed.set()

    def restore(self) -> None:
        """Listen again, on the same port."""
        self.start()

    def stop(self) -> None:
        self._armed.clear()
        self._drop_everything()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: down or stopped
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, sink, from_client in ((client, upstream, True),
                                              (upstream, client, False)):
                threading.Thread(target=self._relay, args=(source, sink, from_client),
                                 daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                # a request's line and headers come in one send; a body never starts so
                if (from_client and self._armed.is_set()
                        and data.startswith((b"PUT ", b"POST "))):
                    self._armed.clear()
                    self._drop_everything()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update((source, sink))
            for end in (source, sink):
                _close(end)

    def _drop_everything(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed = list(self._sockets)
            self._sockets.clear()
            self.went_down.set()
        if listener is not None:
            _close(listener)  # shutdown wakes the accepting thread
        for end in doomed:
            _close(end)


def _close(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        end.close()


class ConditionalWritesOneAtATime:
    """A WSGI wrapper that serves the writes carrying ``If-None-Match``/``If-Match`` one at a
    time. moto 5 checks the condition and then writes, with nothing between the two, so on its
    threaded server two concurrent ``If-None-Match: *`` puts of one key could both win; S3 (and
    SeaweedFS, ``tests/seaweed_support.py``) decides them atomically, as delta-rs's and
    percolake's log writes rely on."""

    CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST") or not any(
                name in environ for name in self.CONDITIONS):
            return self.app(environ, start_response)
        with self._lock:  # the whole answer is made inside: moto returns it as a list
            return list(self.app(environ, start_response))


def _serve() -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = ConditionalWritesOneAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    try:
        while sys.stdin.buffer.read(1):  # until the parent closes the pipe (or dies)
            pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    _serve()
