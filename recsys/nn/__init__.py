"""Layers built on the kernels: embeddings, attention, transformer, multi-interest heads, capsules."""
