"""File and memory-map I/O: see docs/architecture.md."""
