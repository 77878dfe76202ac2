"""The durable records of authentication and authorization: bearer tokens (hashes only) and
ACL entries. Plain values; every store keeps them (``coordinator/store``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Permission(str, enum.Enum):
    """What an ACL entry grants. On pipelines: WRITE (drive it), DESCRIBE (read it), ADMIN
    (everything, including another principal's transactions); on tables: WRITE, READ."""

    WRITE = "WRITE"
    DESCRIBE = "DESCRIBE"
    ADMIN = "ADMIN"
    READ = "READ"


class Resource(str, enum.Enum):
    PIPELINE = "pipeline"
    TABLE = "table"


PERMISSIONS_OF = {
    Resource.PIPELINE: (Permission.WRITE, Permission.DESCRIBE, Permission.ADMIN),
    Resource.TABLE: (Permission.WRITE, Permission.READ),
}
# A permission also grants the ones listed here.
IMPLIED = {
    Permission.ADMIN: (Permission.ADMIN, Permission.WRITE, Permission.DESCRIBE),
    Permission.WRITE: (Permission.WRITE, Permission.DESCRIBE, Permission.READ),
    Permission.DESCRIBE: (Permission.DESCRIBE,),
    Permission.READ: (Permission.READ,),
}
ANY_PRINCIPAL = "*"


@dataclass(frozen=True)
class TokenRecord:
    """A bearer token: its public id and the SHA-256 (hex) of its secret part; never the
    secret itself."""

    token_id: str
    secret_hash: str
    principal: str
    created_ms: int
    revoked_ms: int = 0  # 0: live
    description: str = ""

    @property
    def live(self) -> bool:
        return self.revoked_ms == 0


@dataclass(frozen=True)
class AclRecord:
    """``principal`` (or ``*``: every authenticated principal) holds ``permission`` on the
    pipelines or tables ``pattern`` names."""

    principal: str
    resource: Resource
    pattern: str
    permission: Permission
    created_ms: int = 0

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.principal, self.resource.value, self.pattern, self.permission.value)

    def to_row(self) -> dict[str, object]:
        return {"principal": self.principal, "resource": self.resource.value,
                "pattern": self.pattern, "permission": self.permission.value,
                "created_ms": self.created_ms}

    @classmethod
    def from_row(cls, row: dict[str, object]) -> AclRecord:
        return cls(principal=str(row["principal"]), resource=Resource(row["resource"]),
                   pattern=str(row["pattern"]), permission=Permission(row["permission"]),
                   created_ms=int(row["created_ms"]))  # type: ignore[arg-type]
