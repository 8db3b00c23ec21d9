"""Triton implementations of the ops in `edgemoe.kernels`.

Importing anything here imports Triton: only the dispatchers in `edgemoe.kernels.*`
(on CUDA tensors) and tests do, lazily. Every kernel also runs under Triton's
interpreter (`TRITON_INTERPRET=1`, CPU tensors), which is how CI checks their logic.
"""
