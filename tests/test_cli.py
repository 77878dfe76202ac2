"""The command line: ``--help`` explains every flag; ``reset-pipeline`` against a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from coordinator.cli.program import _parser
from percolake.v1 import coordinator_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _words(text: str) -> str:
    return " ".join(text.split())


def _subcommands(parser) -> dict:
    found = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    return dict(found[0].choices) if found else {}


def _commands() -> dict:
    """Every command that runs, by its words: "serve", "transactions list", ..."""
    commands = {}
    for name, parser in _subcommands(_parser()).items():
        nested = _subcommands(parser)
        commands.update({f"{name} {n}": p for n, p in nested.items()} if nested
                        else {name: parser})
    return commands


def test_top_level_help_names_every_command():
    result = cli("--help", check=True)
    text = _words(result.stdout)
    assert "percolake-coordinator" in text
    for name, parser in _commands().items():
        assert name.split()[0] in text
        assert parser.description, f"command {name} has no description"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_command_help_explains_every_flag(command):
    text = _words(cli(*command.split(), "--help", check=True).stdout)
    actions = [a for a in _commands()[command]._actions if a.option_strings and a.dest != "help"]
    assert actions
    for action in actions:
        assert action.help and len(action.help.split()) >= 2, \
            f"{command} {action.option_strings}: no real help text"
        for flag in action.option_strings:
            assert flag in text, f"{flag} missing from `{command} --help`"
        assert _words(action.help)[:40] in text, f"help of {action.option_strings} not shown"


def test_console_script_runs():
    script = Path(sys.executable).parent / "percolake-coordinator"
    if not script.exists():
        pytest.fail(f"{script} missing: install the project (pip install -e .[dev])")
    result = subprocess.run([str(script), "serve", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "--warehouse" in result.stdout


@pytest.mark.parametrize(("args", "words"), [
    (["serve", "--warehouse", "/lake"], ["--data-dir"]),
    (["serve", "--data-dir", "/tmp/x"], ["--warehouse"]),
    (["serve", "--data-dir", "/tmp/x", "--warehouse", "/lake", "--txn-timeout", "0"],
     ["--txn-timeout", "must be > 0"]),
    (["reset-pipeline", "--pipeline", "p"], ["--reason"]),
    (["reset-pipeline", "--pipeline", "p", "--reason", "r", "--start-barrier", "-1"],
     ["--start-barrier", "must be >= 0"]),
    (["no-such-command"], ["no-such-command"]),
])
def test_bad_command_lines_exit_2_naming_the_problem(args, words):
    result = cli(*args)
    assert result.returncode == 2
    for word in words:
        assert word in result.stderr


def test_reset_pipeline_cli(daemon):
    stub = daemon.stub
    query_id = str(uuid.uuid4())
    reg = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id="orders",
                                                           query_id=query_id), timeout=30)
    old = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id="orders", batch_id=0, epoch=reg.epoch, query_id=query_id), timeout=30)
    stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=old.transaction.txn_id,
                                                       epoch=reg.epoch), timeout=30)
    live = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id="orders", batch_id=1, epoch=reg.epoch, query_id=query_id), timeout=30)
    reset = ["reset-pipeline", "--target", daemon.target, "--pipeline", "orders",
             "--reason", "checkpoint replaced"]

    first = cli(*reset, "--generation", "0", check=True)
    reply = json.loads(first.stdout)
    assert reply["changed"] is True and reply["generation"] == 1
    assert reply["aborted_txn_ids"] == [live.transaction.txn_id]
    pipeline = stub.GetPipeline(pb.GetPipelineRequest(pipeline_id="orders"), timeout=30)
    assert (pipeline.generation, pipeline.query_id) == (1, "")
    assert pipeline.epoch > reg.epoch
    assert [(r.from_generation, r.to_generation, r.reason, r.previous_query_id)
            for r in pipeline.resets] == [(0, 1, "checkpoint replaced", query_id)]

    again = cli(*reset, "--generation", "0", check=True)
    assert json.loads(again.stdout) == {**reply, "changed": False, "aborted_txn_ids": []}
    assert stub.GetPipeline(pb.GetPipelineRequest(pipeline_id="orders"), timeout=30) == pipeline

    wrong = cli(*reset, "--generation", "5")
    assert wrong.returncode != 0
    assert "FAILED_PRECONDITION" in wrong.stderr and "generation 1, not 5" in wrong.stderr
    unknown = cli("reset-pipeline", "--target", daemon.target, "--pipeline", "nobody",
                  "--reason", "r")
    assert unknown.returncode != 0 and "NOT_FOUND" in unknown.stderr
    assert stub.GetPipeline(pb.GetPipelineRequest(pipeline_id="orders"), timeout=30) == pipeline

    # The new generation starts its batch ids afresh; the old history stays readable.
    fresh = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id="orders", batch_id=0, epoch=pipeline.epoch, query_id=str(uuid.uuid4())),
        timeout=30)
    assert not fresh.already_committed and fresh.transaction.generation == 1
    history = stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id="orders",
                                                               generation=0), timeout=30)
    assert {t.txn_id: pb.TransactionState.Name(t.state) for t in history.transactions} == {
        old.transaction.txn_id: "APPLIED", live.transaction.txn_id: "ABORTED"}


def test_reset_pipeline_cli_starts_the_new_generation_at_the_start_barrier(daemon):
    stub = daemon.stub
    stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id="late-reader"), timeout=30)
    start = 7 << 30
    reset = cli("reset-pipeline", "--target", daemon.target, "--pipeline", "late-reader",
                "--reason", "history pruned", "--start-barrier", str(start), check=True)
    assert json.loads(reset.stdout)["generation"] == 1
    plan = stub.PlanBarrier(pb.PlanBarrierRequest(pipeline_id="late-reader"), timeout=30)
    assert (plan.generation, plan.start_barrier, plan.after_barrier) == (1, start, start)
