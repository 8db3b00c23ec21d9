"""Routed experts: host store, device slot cache, eviction policies, executors."""
