"""Qwen3.8-Flash-Next's per-layer embedding tables: geometry, hashing per step, and the
stores that hold them on the device, in pinned host memory or on disk."""
