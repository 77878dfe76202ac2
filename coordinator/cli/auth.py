"""The security parts of the command line: ``serve``'s authentication flags, and the
``acl add|remove|list`` and ``tokens create|revoke|list`` commands (administrative RPCs to a
running coordinator, following its leader like every client command)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.cli.client import add_common_arguments, run_calls

PERMISSIONS = ("WRITE", "DESCRIBE", "ADMIN", "READ")


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--authenticate", action="store_true",
                       help="every call needs a bearer token (metadata 'authorization: Bearer "
                       "<token>') or, with --client-ca, a client certificate: its subject's one "
                       "CN names principal 'cert:<CN>'; permissions come from the ACL entries "
                       "(docs/security.md). Off: every caller may do everything")
    serve.add_argument("--open-health", action="store_true",
                       help="with --authenticate, serve gRPC health and reflection without a "
                       "credential (for load balancers and probes that cannot send one); by "
                       "default they need one too: nothing answers an unknown caller")
    serve.add_argument("--audit-log", default="", metavar="PATH",
                       help="append one JSON line per administrative action and per refused "
                       "request to this file (created 0600); never a secret in it")
    serve.add_argument("--admin-token-file", default="", metavar="PATH",
                       help="bootstrap: the token in this file (created with a new one if "
                       "missing, mode 0600; refused if others may read it) authenticates "
                       "principal 'admin' with ADMIN on every pipeline, held in memory only (no "
                       "client certificate is this principal: they are 'cert:<CN>')")


def option_fields(args: argparse.Namespace) -> dict[str, Any]:
    """ServerOptions' fields of :func:`add_serve_arguments`' flags."""
    return {"authenticate": args.authenticate, "open_health": args.open_health,
            "audit_log": args.audit_log, "admin_token_file": args.admin_token_file}


def add_commands(commands: Any, default_target: str) -> None:
    acl = commands.add_parser(
        "acl", help="add, remove or list permissions (ACL entries)",
        description="Manage who may do what (needs ADMIN on every pipeline with "
        "--authenticate). A pipeline entry grants WRITE, DESCRIBE or ADMIN on pipelines named "
        "by an id, 'prefix*' or '*'; a table entry grants WRITE or READ on a table URI or "
        "folder and every table below it, or '*'. Changes are durable and take effect at once.")
    acl.add_argument("action", choices=["add", "remove", "list"], help="what to do")
    acl.add_argument("--principal", help="whom the entry is for: a token's principal, "
                     "'cert:CN' for a client certificate whose subject CN is CN, or '*' (every "
                     "authenticated principal); with list: only this principal's entries")
    scope = acl.add_mutually_exclusive_group()
    scope.add_argument("--pipeline", metavar="PATTERN",
                       help="the pipelines: an id, 'prefix*' or '*'")
    scope.add_argument("--table", metavar="PATTERN",
                       help="the tables: a table URI or folder (it and every table below it) "
                       "or '*'")
    acl.add_argument("--permission", choices=PERMISSIONS, type=str.upper,
                     help="WRITE, DESCRIBE or ADMIN on pipelines; WRITE or READ on tables")
    add_common_arguments(acl, default_target)

    tokens = commands.add_parser(
        "tokens", help="create, revoke or list bearer tokens",
        description="Manage bearer tokens (needs ADMIN on every pipeline with "
        "--authenticate). create prints the new token once: the coordinator stores only its "
        "hash. revoke takes effect at once. list never shows a token, only its id.")
    tokens.add_argument("action", choices=["create", "revoke", "list"], help="what to do")
    tokens.add_argument("--principal", help="create: whom the token authenticates (not "
                        "'cert:...', the principals of client certificates, nor 'admin', the "
                        "bootstrap token's); list: only this principal's tokens")
    tokens.add_argument("--description", default="",
                        help="create: a note kept with the token (what uses it)")
    tokens.add_argument("--id", dest="token_id", metavar="TOKEN_ID",
                        help="revoke: the token's id, as list shows it")
    tokens.add_argument("--all", action="store_true",
                        help="list: revoked tokens too")
    add_common_arguments(tokens, default_target)


def run(args: argparse.Namespace) -> int:
    """Runs ``acl`` or ``tokens``; 0 done, 1 the coordinator refused, 2 bad arguments."""
    from percolake.v1 import coordinator_pb2 as pb

    name = f"{args.command} {args.action}"
    try:
        method, request, show = (_acl_call if args.command == "acl" else _tokens_call)(args, pb)
    except ValueError as exc:
        print(f"percolake-coordinator {name}: error: {exc}", file=sys.stderr)
        return 2
    return _call(args, name, method, request, show)


def _call(args: argparse.Namespace, name: str, method: str, request: Any,
          show: Callable[[Any, bool], str]) -> int:
    return run_calls(name, args, lambda call: show(call(method, request), args.json))


def _acl_call(args: argparse.Namespace, pb: Any) -> tuple[str, Any, Callable[[Any, bool], str]]:
    if args.action == "list":
        return "ListAcls", pb.ListAclsRequest(principal=args.principal or ""), _show_acls
    missing = [flag for flag, value in (("--principal", args.principal),
                                        ("--pipeline or --table", args.pipeline or args.table),
                                        ("--permission", args.permission)) if not value]
    if missing:
        raise ValueError(f"acl {args.action} needs {', '.join(missing)}")
    resource = pb.PIPELINE if args.pipeline else pb.TABLE
    entry = pb.AclEntry(principal=args.principal, resource_type=resource,
                        pattern=args.pipeline or args.table,
                        permission=pb.Permission.Value(args.permission))
    method = "AddAcl" if args.action == "add" else "RemoveAcl"
    return method, pb.AclRequest(entry=entry), _show_acl_change


def _tokens_call(args: argparse.Namespace,
                 pb: Any) -> tuple[str, Any, Callable[[Any, bool], str]]:
    if args.action == "create":
        if not args.principal:
            raise ValueError("tokens create needs --principal")
        return ("CreateToken", pb.CreateTokenRequest(principal=args.principal,
                                                     description=args.description),
                _show_new_token)
    if args.action == "revoke":
        if not args.token_id:
            raise ValueError("tokens revoke needs --id TOKEN_ID (tokens list shows the ids)")
        return "RevokeToken", pb.RevokeTokenRequest(token_id=args.token_id), _show_revoked
    return ("ListTokens", pb.ListTokensRequest(principal=args.principal or "",
                                               include_revoked=args.all), _show_tokens)


# ---------------------------------------------------------------- output

def _when(unix_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_ms / 1000)) if unix_ms else ""


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
                     .rstrip() for row in [header, *rows])


def _acl_json(entry: Any) -> dict[str, Any]:
    from percolake.v1 import coordinator_pb2 as pb

    return {"principal": entry.principal,
            "resource": pb.ResourceType.Name(entry.resource_type).lower(),
            "pattern": entry.pattern, "permission": pb.Permission.Name(entry.permission),
            "created_unix_ms": entry.created_unix_ms}


def _show_acls(reply: Any, as_json: bool) -> str:
    entries = [_acl_json(e) for e in reply.entries]
    if as_json:
        return json.dumps(entries)
    if not entries:
        return "no ACL entries"
    return _table(["PRINCIPAL", "RESOURCE", "PATTERN", "PERMISSION", "CREATED (UTC)"],
                  [[e["principal"], e["resource"], e["pattern"], e["permission"],
                    _when(e["created_unix_ms"])] for e in entries])


def _show_acl_change(reply: Any, as_json: bool) -> str:
    entry = _acl_json(reply.entry)
    if as_json:
        return json.dumps({"entry": entry, "changed": reply.changed})
    what = (f"{entry['permission']} on {entry['resource']} {entry['pattern']} for "
            f"{entry['principal']}")
    return what + ("" if reply.changed else " (unchanged)")


def _token_json(token: Any) -> dict[str, Any]:
    return {"token_id": token.token_id, "principal": token.principal,
            "description": token.description, "created_unix_ms": token.created_unix_ms,
            "revoked_unix_ms": token.revoked_unix_ms}


def _show_tokens(reply: Any, as_json: bool) -> str:
    found = [_token_json(t) for t in reply.tokens]
    if as_json:
        return json.dumps(found)
    if not found:
        return "no tokens"
    return _table(["TOKEN ID", "PRINCIPAL", "CREATED (UTC)", "REVOKED (UTC)", "DESCRIPTION"],
                  [[t["token_id"], t["principal"], _when(t["created_unix_ms"]),
                    _when(t["revoked_unix_ms"]), t["description"]] for t in found])


def _show_new_token(reply: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps({**_token_json(reply.token), "bearer_token": reply.bearer_token})
    return (f"token {reply.token.token_id} for principal {reply.token.principal} (shown once; "
            f"the coordinator keeps only its hash):\n{reply.bearer_token}")


def _show_revoked(reply: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps({**_token_json(reply.token), "changed": reply.changed})
    return f"token {reply.token.token_id} of {reply.token.principal} revoked" + (
        "" if reply.changed else " (it already was)")
