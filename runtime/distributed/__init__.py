"""Tensor parallelism on torch.distributed (NCCL on GPU, gloo on CPU) and multi-node start-up
(issue 26): the parallel state, parallel layers, rank launch and lock-step followers."""
