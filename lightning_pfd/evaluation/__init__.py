"""Measurement protocols as plain objects (pure torch, no Lightning import).

The evaluation layer holds *what* is measured and *how*: fixed evaluation seeds, reference flows
and their caches, sharding of work over processes and the metrics they feed. The callbacks in
:mod:`lightning_pfd.callbacks` only decide *when* to measure and *where* to log; ``icr-sweep``,
``pite``, the sweeps and the benchmarks use these objects directly, and so can a notebook::

    from lightning_pfd.evaluation import FlowEvaluation
    ev = FlowEvaluation.from_datamodule(dm, model)
    ev.measure(model).values["e_gen"]               # the measurement contract (below)
    ev.evaluate(model.denoiser).metrics["e_mem"]     # the full result (endpoints, features)

Each of the four implements the measurement contract of :mod:`lightning_pfd.evaluation.base`
(``prepare(datamodule, model, comm)``, ``measure(model, comm) -> Measurement``), so
:class:`~lightning_pfd.callbacks.EvaluationMonitor` runs any of them; its own ``evaluate``
returns the evaluation's full result.

* :class:`FlowEvaluation` -- E_gen, E_mem (PFD paper eq. 4 and 8), frozen-noise losses and user
  metrics registered against a reference flow;
* :class:`RepresentationEvaluation` -- ICR, Tr Sigma_s, Tr Sigma_xi and the spectrum of a tap's
  features (ICR paper eq. 3-5);
* :class:`MemorizationEvaluation` -- the memorization ratio of generated samples;
* :class:`TailEvaluation` -- RMSQE and LOADER of a physical observable with their same-law floors.
"""
from .base import SINGLE, Comm, Evaluation, Measurement, NonFinite, Units, strategy_comm
from .flow import FlowEvaluation, FlowResult
from .memorization import MemorizationEvaluation
from .representation import RepresentationEvaluation
from .sharding import shard_indices
from .tail import TailEvaluation, TailSettings

__all__ = ["Evaluation", "Measurement", "Units", "NonFinite", "Comm", "SINGLE", "strategy_comm",
           "FlowEvaluation", "FlowResult", "RepresentationEvaluation", "MemorizationEvaluation",
           "TailEvaluation", "TailSettings",
           "shard_indices"]
