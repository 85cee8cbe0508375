"""Endpoints of a finished trial for the bias–variance decomposition (Def. 3 of the PFD paper).

Def. 3 compares K independently trained students on the *same* initial states x_gen,T: the
mean student flow, its distance to the teacher (bias) and the spread of the students around it
(variance). Each trial therefore saves, at its end, the descriptor-space (Ψ) PF-ODE endpoints of

* the final (EMA) student ``pl_module.denoiser``,
* the teacher (``datamodule.teacher``) and
* the empirical denoiser of the trial's training set (eq. 46),

on the GeneralizationMonitor's evaluation seeds, measured by the monitor's own
:class:`~lightning_pfd.evaluation.flow.FlowEvaluation` (same seeds, solver, descriptor and cached
references as every epoch's E_gen / E_mem): the PFD (eq. 4) of ``student`` vs ``teacher`` is the
trial's final E_gen, vs ``empirical`` its final E_mem.

File ``endpoints.pt``: ``{"seeds": int64 (M,), "student": float64 (M, d), "teacher": float64
(M, d) (absent without a teacher), "empirical": float64 (M, d)}``; ``max_seeds`` keeps the first
seeds only (storage: M = 10^4 CIFAR-10 endpoints are 3 × 245 MB).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

__all__ = ["find_generalization_monitor", "final_endpoints", "save_endpoints"]


def find_generalization_monitor(trainer):
    """The trainer's GeneralizationMonitor with the standard keys (else the first one), or None."""
    from ..callbacks.presets import preset_of

    found = [cb for cb in trainer.callbacks if preset_of(cb, "GeneralizationMonitor")]
    plain = [cb for cb in found if getattr(cb, "name", None) is None]
    return (plain or found or [None])[0]


@torch.no_grad()
def final_endpoints(trainer, pl_module, datamodule, max_seeds: Optional[int] = None) -> Optional[dict]:
    """Student / teacher / empirical Ψ-endpoints on the monitor's evaluation seeds (see the
    module docstring), or None when the trainer has no GeneralizationMonitor."""
    monitor = find_generalization_monitor(trainer)
    if monitor is None or datamodule is None or getattr(datamodule, "train_data", None) is None:
        return None
    ev = monitor.evaluation
    ev.prepare(datamodule, pl_module, ev.comm)  # bound at fit start: the references are kept
    settings = ev.settings
    own = (ev.sigmas is None and ev.precision is None and not settings.compile and hasattr(pl_module, "generate"))
    gen = (functools.partial(pl_module.generate, sampler=settings.sampler, batch_size=ev.batch_size)
           if own else None)  # the student's own solver, as the monitor samples it
    was_training = pl_module.training
    pl_module.eval()
    try:
        res = ev.evaluate(pl_module.denoiser, generate=gen, device=pl_module.device, gather=True)
    finally:
        pl_module.train(was_training)
    m = len(res.seeds) if max_seeds is None else min(len(res.seeds), int(max_seeds))
    out = {"seeds": res.seeds[:m].to(torch.int64).cpu()}
    for name, feats in res.features().items():
        out[name] = feats[:m].to(torch.float64).cpu()
    return out


def save_endpoints(path, endpoints: dict) -> None:
    """Write ``endpoints.pt`` atomically (tmp file + rename)."""
    import io

    from ..atomic import atomic_write

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in endpoints.items()}, buf)
    atomic_write(path, buf.getvalue())
