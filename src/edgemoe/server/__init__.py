"""The HTTP server: FastAPI routes over a protocol-neutral generation core.

NOTE: nothing under this package may import torch (directly or transitively); the
server process talks to the engine process over ZMQ only. Modules are imported
where used, so this file imports nothing.
"""
