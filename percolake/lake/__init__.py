"""Lake code both sides share: table URIs and warehouse rules, Delta commits, attempt cleanup."""
