"""Authentication (bearer tokens, client certificates), authorization (ACLs per pipeline and
table) and the audit log. See docs/security.md."""
