"""Build SM120-enabled FlashInfer and sglang wheels from pinned, patched upstream sources."""
