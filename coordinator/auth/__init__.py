"""Authentication (bearer tokens, client certificates), authorization (ACLs per pipeline and
table) and the audit log, at request time: the interceptor, the access guard, the admin service.
The token and ACL records the stores keep are below the store, in ``coordinator/auth_records.py``.
See docs/security.md."""
