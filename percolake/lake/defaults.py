"""Defaults of the lake's maintenance, in a module the coordinator's CLI imports to show them
without loading pyarrow or delta-rs."""

DEFAULT_TARGET_SIZE = 100 * 1024 * 1024  # bytes of one compacted file, at most (delta-rs's)
DEFAULT_RETENTION_HOURS = 168  # a vacuum's: Delta's deletedFileRetentionDuration, a week
