"""The short fuzz run of CI (issue 17 item 7): ``scripts/fuzz.py`` sends 1,200 valid, mutated,
random and non-protobuf requests across every RPC to a real daemon: no INTERNAL or UNKNOWN
status, no request near its 5 s deadline, a daemon that stays up, a store intact and served
after a restart. ``python scripts/fuzz.py --requests 100000`` is the long run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from percolake.v1 import coordinator_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 1200


def _load_fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("percolake_fuzz", ROOT / "scripts" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzzer()


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Any:
    args = fuzz.parse_args(["--requests", str(REQUESTS), "--seed", "11", "--threads", "2",
                            "--workdir", str(tmp_path_factory.mktemp("fuzz"))])
    return fuzz.fuzz(args)


def _shown(outcomes: list[Any]) -> list[str]:
    return [f"{o.rpc} [{o.mode}: {o.change}] {o.code.name} after {o.seconds:.1f} s: "
            f"{o.details[:200]}" for o in outcomes[:10]]


def test_every_request_was_sent_and_the_fuzzer_itself_did_not_fail(result):
    assert result.tally.sent == REQUESTS
    assert not result.tally.errors, result.tally.errors[0]


def test_no_reply_is_internal_or_unknown(result):
    assert not result.tally.failures, _shown(result.tally.failures)


def test_no_request_comes_near_its_5_s_deadline(result):
    assert fuzz.HANG_S == 5.0
    assert not result.tally.hangs, _shown(result.tally.hangs)
    slowest = max(result.tally.slowest.items(), key=lambda item: item[1])
    assert slowest[1] < fuzz.HANG_S, slowest


def test_the_store_is_intact_and_served_after_a_restart(result):
    assert not result.problems, result.problems[:10]


def test_every_rpc_of_the_service_descriptor_gets_every_kind_of_request(result):
    declared = {m.name for m in pb.DESCRIPTOR.services_by_name["Coordinator"].methods}
    other = {f"{s.name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values()
             if s.name != "Coordinator" for m in s.methods}
    assert declared | other <= set(fuzz.RPCS)
    missing = [(rpc, mode) for rpc in fuzz.RPCS for mode in fuzz.MODES
               if not result.tally.pairs[(rpc, mode)]]
    assert not missing, missing


def test_an_rpc_without_a_hand_written_builder_still_gets_requests_of_its_type():
    """What happens to an RPC added to the proto later: random messages of its request type."""
    import random

    rng = random.Random(3)
    pools = fuzz.Pools(warehouse="/nowhere", tables=["/nowhere/t"])
    no_builder = fuzz.Rpc("New", "/percolake.v1.Coordinator/New", pb.OpenTransactionRequest,
                          pb.OpenTransactionResponse, False, False, True)
    fields: set[str] = set()
    for mode in ("valid", "mutated", "random"):
        for _ in range(30):
            data, _change = fuzz.build(rng, pools, no_builder, mode)
            fields |= {f.name for f, _ in pb.OpenTransactionRequest.FromString(data).ListFields()}
    assert {"pipeline_id", "batch_id", "tables", "timeout_ms"} <= fields


def test_garbage_requests_are_not_protobuf_messages_of_any_request_type():
    import random

    rng = random.Random(5)
    types = [r.request_type for r in fuzz.RPCS.values() if r.request_type.DESCRIPTOR.fields]
    sizes = set()
    for name, make in fuzz.GARBAGE:
        if name == "over the size limit":  # well-formed, refused for its size alone
            continue
        for _ in range(10):
            data = make(rng)
            sizes.add(len(data))
            for request_type in types:
                with pytest.raises(DecodeError):
                    request_type.FromString(data)
    assert max(sizes) > 1000 and min(sizes) <= 2
