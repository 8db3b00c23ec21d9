"""Model building blocks. Each layer holds its tensors and calls kernels/ for compute;
per-batch state arrives explicitly as a ForwardBatch."""
