"""The S3 API server of the object-store tests: moto's ``ThreadedMotoServer`` on 127.0.0.1 and
a free port, in a child process of its own.

Why a child process: some delta-rs calls (``DeltaTable.is_deltatable``, the object-store
handler's listing) hold the GIL while they wait for the store, so a server thread in the same
interpreter would never answer them (measured: a deadlock). The child exits when its standard
input closes, so it never outlives the test session, even after a crash of pytest.

``MotoServer.env()`` is the environment a process needs to use the server (the standard AWS
variables, plus ``AWS_EC2_METADATA_DISABLED`` so that no SDK ever looks for an instance role
off this machine). The secret key is new for each session, so tests can look for it in logs
and stores. Only 127.0.0.1 is ever contacted.

Run as a module (``python -m tests.s3_support``) it is the child: it prints its port and
serves until its standard input closes.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
ACCESS_KEY_ID = "percolake-test-key"
# A port nothing listens on: connections are refused at once (used for "unreachable").
CLOSED_PORT = 9


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MotoServer:
    """moto's S3 API server in a child process; ``start``, use, ``stop``."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.secret = f"percolake-test-secret-{uuid.uuid4().hex}"
        self.port = 0
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> MotoServer:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
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
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None:
            return
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def env(self, **overrides: str) -> dict[str, str]:
        """The variables a process needs to reach this server as the test user."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
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
                aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=self.secret)
        return self._client

    def filesystem(self) -> Any:
        """Arrow's S3 filesystem on this server: how the tests write data files, as an
        executor writing Arrow batches would."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=ACCESS_KEY_ID, secret_key=self.secret,
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


def _serve() -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    try:
        while sys.stdin.buffer.read(1):  # until the parent closes the pipe (or dies)
            pass
    finally:
        server.stop()


if __name__ == "__main__":
    _serve()
