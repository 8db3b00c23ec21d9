"""Compute kernels: one module per op, each a torch reference plus (later) a fast path
with the same signature. Layers call these; no kernel lives inside a layer file."""
