"""Measurement protocols as plain objects (pure torch, no Lightning import).

The evaluation layer holds *what* is measured and *how*: fixed evaluation
seeds, reference flows and their caches, sharding of work over processes
and the metrics they feed. The callbacks in :mod:`lightning_pfd.callbacks`
only decide *when* to measure and *where* to log. Import from the
submodules (for example ``from lightning_pfd.evaluation.sharding import
shard_indices``).
"""
