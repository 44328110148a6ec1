"""The multi-process job: see docs/architecture.md."""
