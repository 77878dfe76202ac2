"""The committed gRPC code in ``percolake/v1`` is exactly what ``scripts/gen_protos.py`` makes
from ``protos/`` (never edited by hand, never stale)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "percolake" / "v1"


def _gen_protos():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_the_committed_code(tmp_path):
    generated = _gen_protos().generate(tmp_path)
    relative = sorted(p.relative_to(tmp_path) for p in generated)
    assert Path("percolake/v1/coordinator_pb2.py") in relative
    assert Path("percolake/v1/coordinator_pb2_grpc.py") in relative
    assert Path("percolake/v1/coordinator_pb2.pyi") in relative
    drifted = [str(rel) for rel in relative
               if not (ROOT / rel).exists() or (ROOT / rel).read_bytes() != (tmp_path / rel)
               .read_bytes()]
    assert not drifted, (f"generated code differs from the committed files {drifted}: "
                         "run `python scripts/gen_protos.py` and commit the result")

    committed = {p.relative_to(ROOT) for p in PACKAGE.rglob("*")
                 if p.is_file() and p.suffix in {".py", ".pyi"}}
    stale = sorted(str(p) for p in committed - set(relative))
    assert not stale, f"committed files no .proto generates any more: {stale}"


def test_a_changed_proto_shows_up_as_drift(tmp_path):
    """Generation really reads the .proto: one added field changes the generated code."""
    gen = _gen_protos()
    protos = tmp_path / "protos"
    for proto in gen.PROTO_DIR.rglob("*.proto"):
        copy = protos / proto.relative_to(gen.PROTO_DIR)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(proto.read_text())
    edited = protos / "percolake" / "v1" / "coordinator.proto"
    text = edited.read_text()
    assert "message GetPipelineRequest {\n  string pipeline_id = 1;\n" in text
    edited.write_text(text.replace("message GetPipelineRequest {\n  string pipeline_id = 1;\n",
                                   "message GetPipelineRequest {\n  string pipeline_id = 1;\n"
                                   "  bool drifted = 2;\n"))
    gen.PROTO_DIR = protos
    out = tmp_path / "out"
    out.mkdir()
    gen.generate(out)
    rel = Path("percolake/v1/coordinator_pb2.py")
    assert (out / rel).read_bytes() != (ROOT / rel).read_bytes()
