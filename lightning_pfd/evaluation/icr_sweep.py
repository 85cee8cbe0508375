"""ICR(sigma) and a linear probe over a noise grid (Fig. 3 of *Evaluating the Representation Space
of Diffusion Models via Self-Supervised Principles*, the ICR paper), as plain functions (pure torch
and scikit-learn, no Lightning); the command line is :mod:`lightning_pfd.commands.icr_sweep`.

For every sigma of the grid (:func:`sweep`):

- ICR, Tr(Sigma_s), Tr(Sigma_xi) from
  :class:`~lightning_pfd.evaluation.representation.RepresentationEvaluation`, the protocol of
  ``ICRMonitor`` (fixed seeded training subset, two augmented + noised views, EMA denoiser, tap
  features, optional fixed projection);
- linear-probe accuracy: the same evaluation's features (same tap and projection) of the training
  images noised at sigma (seeded noise, stream ``icr_sweep.noise``, no augmentation) train a
  scikit-learn ``LogisticRegression`` on standardized features; it is scored on the held-out
  images noised the same way (ICR paper App. C, Fig. 3).

The semantic window is where ICR is lowest and the probe most accurate. From a notebook::

    rows = sweep(module, datamodule, [0.05, 0.29, 1.0], d_proj=64)
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from .representation import RepresentationEvaluation

__all__ = ["DEFAULT_SIGMAS", "sweep", "sweep_evaluation", "probe_features", "linear_probe_accuracy",
           "PROBE_TEST_SEED_OFFSET"]

#: the default noise grid of the sweep
DEFAULT_SIGMAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.29, 0.5, 1.0, 2.0, 5.0)
#: noise seeds of the held-out probe images: ``seed + PROBE_TEST_SEED_OFFSET + i`` (the training
#: images use ``seed + i``)
PROBE_TEST_SEED_OFFSET = 10_000_000


def sweep_evaluation(module: Any, train_data: torch.Tensor, sigmas: Sequence[float],
                     num_images: Optional[int] = None, tap: Optional[str] = None,
                     **settings: Any) -> RepresentationEvaluation:
    """The :class:`RepresentationEvaluation` of a sweep over ``sigmas`` on ``train_data``, checked
    against the loaded ``module`` (tap, ``num_images`` vs the data, sigma range, ``d_proj`` vs the
    tap's dimension: a ConfigError naming the argument); ``settings``: its other arguments."""
    sigmas = [float(s) for s in sigmas]
    ev = RepresentationEvaluation(train_data, num_images=num_images, sigma=sigmas[0],
                                  sigmas=sigmas[1:], tap=tap, **settings)
    ev.check_model(module)
    return ev


@torch.no_grad()
def probe_features(evaluation: RepresentationEvaluation, module: Any, x: torch.Tensor, sigma: float,
                   seed: int, batch_size: int) -> torch.Tensor:
    """The evaluation's (projected) features of ``x`` noised at sigma with seeded noise, no
    augmentation (row i seeded by ``seed + i``); on the CPU."""
    from ..diffusion.noise import seeded_noise
    from ..diffusion.streams import stream

    out = []
    for i in range(0, x.shape[0], batch_size):
        xb = x[i:i + batch_size].to(module.device, torch.float32)
        seeds = torch.arange(i, i + xb.shape[0]) + seed
        n = seeded_noise(seeds, xb.shape[1:], device=module.device, stream=stream("icr_sweep.noise"))
        out.append(evaluation.features(module, xb + sigma * n.to(xb.dtype), sigma))
    return torch.cat(out).cpu()


def linear_probe_accuracy(train_features: torch.Tensor, train_labels: torch.Tensor,
                          test_features: torch.Tensor, test_labels: torch.Tensor,
                          max_iter: int = 2000, seed: int = 0) -> float:
    """Accuracy of a standardized scikit-learn LogisticRegression (App. C, Fig. 3)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, random_state=seed))
    clf.fit(train_features.numpy(), train_labels.numpy())
    return float(clf.score(test_features.numpy(), test_labels.numpy()))


def _has_labels(dm: Any) -> bool:
    return all(getattr(dm, name, None) is not None for name in ("train_labels", "val_labels", "val_data"))


def sweep(module: Any, dm: Any, sigmas: Sequence[float], num_images: Optional[int] = None,
          level: int = 3, tap: Optional[str] = None, d_proj: Optional[int] = None,
          views_per_image: int = 1, probe_train: Optional[int] = None, batch_size: int = 256,
          seed: int = 0, image_shape: Optional[Sequence[int]] = None) -> List[Dict[str, float]]:
    """One row per sigma of ``module`` (a sigma-space model with ``.device``) on the datamodule
    ``dm`` (after setup): sigma, icr, icr_se (delete-a-group jackknife standard error, as the
    ICRMonitor's ``icr/icr_se``), trace_s, trace_xi, n (distinct images), d, tau, cond_xi,
    icr_tau_auto, icr_tau_relative, probe_acc (NaN without labels and validation data).
    ``num_images`` None: min(4096, N); ``probe_train`` None: every training image;
    ``image_shape``: (C, H, W) of flattened images, for the augmentation."""
    sigmas = [float(s) for s in sigmas]
    extra = {} if image_shape is None else {"image_shape": tuple(image_shape)}
    settings = dict(level=level, d_proj=d_proj, views_per_image=views_per_image,
                    batch_size=batch_size, seed=seed, **extra)
    ev = sweep_evaluation(module, dm.train_data, sigmas, num_images, tap, **settings)
    n_train = dm.train_data.shape[0]
    n_probe = n_train if probe_train is None else min(probe_train, n_train)
    rows = []
    for s in sigmas:
        # one evaluation per level, that level its sigma*: the delete-a-group jackknife (its
        # standard error icr_se) is kept at sigma* only; the views, noise and projection do not
        # depend on the other levels, so the values are those of one evaluation over the grid
        # (the same forwards: one per level)
        level_ev = RepresentationEvaluation(dm.train_data, num_images=num_images, sigma=s,
                                            sigmas=[], tap=tap, **settings)
        r = level_ev.evaluate(module)[s]
        acc = float("nan")
        if _has_labels(dm):
            ftr = probe_features(ev, module, dm.train_data[:n_probe], s, seed, batch_size)
            fte = probe_features(ev, module, dm.val_data, s, seed + PROBE_TEST_SEED_OFFSET, batch_size)
            acc = linear_probe_accuracy(ftr, dm.train_labels[:n_probe], fte, dm.val_labels, seed=seed)
        rows.append({"sigma": s, "icr": float(r["icr"]), "icr_se": float(r["icr_se"]),
                     "trace_s": float(r["trace_s"]),
                     "trace_xi": float(r["trace_xi"]), "n": float(r["n"]) / views_per_image,
                     "d": float(r["d"]), "tau": float(r["tau"]), "cond_xi": float(r["cond_xi"]),
                     "icr_tau_auto": float(r["icr_tau_auto"]),
                     "icr_tau_relative": float(r["icr_tau_relative"]), "probe_acc": acc})
    return rows
