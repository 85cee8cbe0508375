"""TailEvaluation: tail metrics of a physical observable between model samples and data.

The PITE strategy of the blog post "A Physically Interpretable Evaluation Strategy" for
heavy-tailed diffusion models, as a plain object (pure torch / numpy, no Lightning):

1. ``num_samples`` samples from the model, one per seed ``seed_offset + i``
   (``model.generate(seeds, batch_size=..., num_steps=...)``), mapped back to physical units by
   ``inverse_transform`` (e.g. a datamodule's) when one is given;
2. each reduced to one scalar by the observable (:mod:`lightning_pfd.metrics.observables`);
3. compared with the same observable of the reference data by RMSQE (the blog's integral of
   the squared quantile difference over [eta, 1], ``definition="blog"``) and LOADER (integral of
   the absolute log ratio of the two KDE densities over the real line, with a density floor);
4. next to the same-law noise floors: the score of a *perfect* model with ``num_samples``
   samples, i.e. the metrics between ``num_splits`` seeded random ``num_samples``-subsets of the
   reference and the remaining points (:func:`~lightning_pfd.metrics.tails.same_law_floor`).

**[choice]** The model is scored against the *same* remaining reference subsets
(:func:`~lightning_pfd.metrics.tails.matched_score`) with the *same* explicit settings (LOADER's
bandwidth and absolute density floor frozen on the full reference by ``loader_settings``), so a
perfect model's expected score is exactly the floor (docs/levy.md). That needs
``num_samples`` < the number of reference samples.

Non-finite sample observables (a diverged sampler): with ``nonfinite="nan"`` (the monitor's
default) RMSQE and LOADER are NaN as soon as one is non-finite -- dropping them would hide
exactly the largest values the tail metrics are about; with ``nonfinite="drop"`` (pite's table)
the finite ones are scored against the floors of ``num_samples`` samples. Either way the
fraction is reported as ``nonfinite``.

Diagnostics next to the blog's scores (:meth:`TailEvaluation.diagnostics`): a heavy-tailed
model's no-root RMSQE can be decided by one sample far outside the data, so every measurement
also reports ``above_range`` / ``below_range`` (the fractions of samples with a value above /
below the data range ``value_range`` in model space: the datamodule's declared range, else the
reference's min/max; NaN counts as above),
``rmsqe_clipped`` / ``loader_clipped`` (the scores with the samples clipped to that range before
the inverse transform -- what the reference codes of the Lévy–Itō model and DLPM do when they
save images) and ``rmsqe_top_share`` (the share of the RMSQE due to its single largest
per-sample contribution, :func:`~lightning_pfd.metrics.tails.matched_rmsqe_contributions`).

From a notebook::

    ev = TailEvaluation.from_datamodule(dm, observable="max", num_samples=512)
    ev.evaluate(model)       # {'rmsqe', 'loader', 'nonfinite', 'rmsqe_floor', 'loader_floor',
                             #  'rmsqe_clipped', 'loader_clipped', 'above_range', 'below_range',
                             #  'rmsqe_top_share'}
    ev.density_figure(ev.observe(ev.sample(model)))   # the blog's Fig. 9 (log-density KDEs)
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..contracts import GENERATING_MODELS, check_on_samples
from ..errors import ConfigError, renamed_fields
from ..metrics.kde import Bandwidth
from ..metrics.observables import get_observable
from ..validation import (FinitePositiveFloat, IntAtLeastTwo, NonNegativeInt, OpenUnitInterval, PositiveInt,
                          check_args)
from .base import SINGLE, Comm, Evaluation, Measurement, NonFinite, TorchDistributed
from ..metrics.tails import (Definition, kde_density, loader_options, loader_settings,
                             matched_rmsqe_contributions, matched_score, rmsqe_options,
                             same_law_floor, top_share)

__all__ = ["TailSettings", "TailEvaluation", "TAIL_LEAVES", "NONFINITE_POLICIES", "REFERENCE_SPLITS", "DIAGNOSTICS",
           "NonfinitePolicy", "ReferenceSplit", "check_generate", "kde_curves", "density_figure"]

#: what becomes of non-finite sample observables (module docstring)
NonfinitePolicy = Literal["nan", "drop"]
NONFINITE_POLICIES = typing.get_args(NonfinitePolicy)
#: the datamodule split a tail measurement compares with
ReferenceSplit = Literal["train", "val"]
REFERENCE_SPLITS = typing.get_args(ReferenceSplit)
METRICS = ("rmsqe", "loader")
#: the diagnostics of :meth:`TailEvaluation.diagnostics` (keys of ``measure``)
DIAGNOSTICS = ("rmsqe_clipped", "loader_clipped", "above_range", "below_range", "rmsqe_top_share")


#: the values of one tail measurement (``density``: the figure)
TAIL_LEAVES = ("rmsqe", "loader", "rmsqe_floor", "loader_floor", "nonfinite", "rmsqe_clipped",
               "loader_clipped", "above_range", "below_range", "rmsqe_top_share")


@dataclasses.dataclass
class TailSettings:
    """Everything that defines a tail measurement (checked at construction, before any data).

    observable, observable_kwargs: a registered observable and its keyword arguments.
    num_samples: generated samples (seeds ``seed_offset + i``); also the n_gen of the floors.
    eta, definition, u_max, num_levels: RMSQE (:func:`~lightning_pfd.metrics.tails.rmsqe`;
        ``definition="blog"``: the integral over [eta, 1], sample maxima included).
    window, floor, relative_floor, bandwidth: LOADER (window None = the whole real line;
        ``floor`` x the reference KDE's peak when ``relative_floor``; bandwidth rule on the
        reference, one bandwidth for both KDEs).
    num_splits, split_seed: the seeded reference splits of the floors and matched scores.
    batch_size, num_steps: passed to ``generate`` (num_steps only when given).
    nonfinite: "nan" or "drop" (module docstring).
    """

    observable: str = "max"
    observable_kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    num_samples: IntAtLeastTwo = 512
    eta: OpenUnitInterval = 0.975
    definition: Definition = "blog"
    u_max: Optional[float] = None
    num_levels: PositiveInt = 200
    window: Any = None
    floor: FinitePositiveFloat = 1e-3
    relative_floor: bool = True
    bandwidth: Bandwidth = "silverman"
    num_splits: PositiveInt = 8
    split_seed: NonNegativeInt = 0
    seed_offset: NonNegativeInt = 50_000_000
    batch_size: PositiveInt = 256
    num_steps: Optional[PositiveInt] = None
    nonfinite: NonfinitePolicy = "nan"

    def __post_init__(self) -> None:
        self.observable_kwargs = dict(self.observable_kwargs or {})
        get_observable(self.observable, **self.observable_kwargs)  # name and keyword arguments
        check_args(TailSettings, vars(self))
        r = rmsqe_options(self.eta, self.u_max, self.num_levels, self.definition)
        self.eta, self.u_max, self.num_levels, self.definition = (
            r["eta"], r["u_max"], r["num_levels"], r["definition"])
        lo = loader_options(self.window, self.floor, self.relative_floor, self.bandwidth)
        self.window, self.floor = lo["window"], lo["floor"]
        self.relative_floor, self.bandwidth = lo["relative_floor"], lo["bandwidth"]

    def rmsqe_kwargs(self) -> dict:
        return rmsqe_options(self.eta, self.u_max, self.num_levels, self.definition)

    def loader_kwargs(self) -> dict:
        return dict(window=self.window, floor=self.floor, relative_floor=self.relative_floor,
                    bandwidth=self.bandwidth)

    def generate_kwargs(self) -> dict:
        kw: Dict[str, Any] = {"batch_size": self.batch_size}
        if self.num_steps is not None:
            kw["num_steps"] = self.num_steps
        return kw


def check_generate(model: Any, num_steps: Optional[int] = None) -> None:
    """ConfigError unless ``model.generate`` exists and (when ``num_steps`` is set) takes it."""
    gen = getattr(model, "generate", None)
    if not callable(gen):
        raise ConfigError("model", f"tail metrics sample with generate(seeds); {type(model).__name__} "
                          "has no generate method", value=type(model).__name__,
                          accepted=GENERATING_MODELS)
    if num_steps is not None:
        params = inspect.signature(gen).parameters
        if "num_steps" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            raise ConfigError("num_steps", f"{type(model).__name__}.generate takes no num_steps",
                              value=num_steps, accepted=[None])


class TailEvaluation(Evaluation):
    """Tail metrics of ``settings.observable`` between samples of a model and ``data``.

    Args:
        data: reference fields (N, *shape) in the model's (training) space.
        settings: a :class:`TailSettings`; or its fields as keyword arguments (both: the keyword
            arguments replace the settings' fields).
        inverse_transform: maps fields to physical units before the observable (None: identity).
        value_range: the data range (lo, hi) in model space for the out-of-range count and the
            clipped scores (None: the reference data's min and max).

    The reference observable, the metric settings frozen on it and the floors are computed once,
    on first use, and cached (``num_samples`` < len(data) is checked then, or by :meth:`check`).
    """

    #: the metric namespace of a monitor of this evaluation (``tail/rmsqe``, ...)
    default_name = "tail"
    #: a monitor's history rows keep the values under their leaves as well (``rmsqe``, ...)
    history_under_leaf = True

    def __init__(self, data: Optional[torch.Tensor] = None, settings: Optional[TailSettings] = None, *,
                 reference: ReferenceSplit = "train",
                 inverse_transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 value_range: Optional[Sequence[float]] = None, **kwargs: Any):
        check_args(TailEvaluation.__init__, {"reference": reference})
        if settings is None:
            settings = TailSettings(**kwargs)
        elif kwargs:
            settings = dataclasses.replace(settings, **kwargs)
        self.settings, self.reference = settings, reference
        self.observable = get_observable(settings.observable, **settings.observable_kwargs)
        self.data: Optional[torch.Tensor] = None
        if data is not None:
            self.bind(data, inverse_transform, value_range)

    def bind(self, data: torch.Tensor, inverse_transform: Optional[Callable] = None,
             value_range: Optional[Sequence[float]] = None) -> None:
        """Compare with the reference fields ``data`` (their observable, metric settings and
        floors are computed again on first use)."""
        if data is None or not hasattr(data, "shape") or len(data.shape) < 1 or len(data) == 0:
            raise ConfigError("data", "need a non-empty batch of reference fields (N, ...)",
                              value=type(data).__name__)
        if value_range is not None:
            lo, hi = (float(v) for v in value_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ConfigError("value_range", "needs finite bounds with low < high",
                                  value=value_range)
            value_range = (lo, hi)
        self.data, self.inverse_transform, self._value_range = data, inverse_transform, value_range
        self._ref: Optional[torch.Tensor] = None
        self._metric_settings: Optional[Dict[str, dict]] = None
        self._floors: Optional[Dict[str, float]] = None

    @classmethod
    def from_datamodule(cls, datamodule: Any, reference: ReferenceSplit = "train",
                        settings: Optional[TailSettings] = None, **kwargs: Any) -> "TailEvaluation":
        """Reference = the datamodule's ``<reference>_data`` (after ``setup``), physical units
        by its ``inverse_transform`` when it has one."""
        value_range = kwargs.pop("value_range", None)
        ev = cls(None, settings, reference=reference, **kwargs)
        ev.bind_datamodule(datamodule, value_range)
        return ev

    def bind_datamodule(self, datamodule: Any, value_range: Optional[Sequence[float]] = None) -> None:
        """:meth:`bind` the datamodule's ``<reference>_data``, ``inverse_transform`` and
        ``value_range`` (``value_range`` given here wins)."""
        data = getattr(datamodule, f"{self.reference}_data", None) if datamodule is not None else None
        if data is None or len(data) == 0:
            have = [r for r in REFERENCE_SPLITS if getattr(datamodule, f"{r}_data", None) is not None]
            raise ConfigError("reference", f"the datamodule has no {self.reference}_data after setup()",
                              value=self.reference, accepted=have)
        names = {}
        if value_range is None:  # the datamodule's
            value_range, names = getattr(datamodule, "value_range", None), {"value_range": "data.value_range"}
        with renamed_fields(names):
            self.bind(data, getattr(datamodule, "inverse_transform", None), value_range)

    # ------------------------------------------------------------------ the measurement contract
    def leaves(self) -> list:
        return [*TAIL_LEAVES, "density"]

    def state_key_args(self) -> Dict[str, Any]:
        s = self.settings
        return dict(observable=s.observable, observable_kwargs=s.observable_kwargs, reference=self.reference,
                    num_samples=s.num_samples, eta=s.eta, seed_offset=s.seed_offset)

    def reset(self) -> None:
        """Forget the reference (the next :meth:`prepare` binds the datamodule's again)."""
        self.data = None

    def prepare(self, datamodule: Any, model: Any = None, comm: Comm = SINGLE) -> None:
        """Bind the datamodule's reference split (once, and again when it is another tensor;
        :meth:`reset` forgets it)."""
        data = getattr(datamodule, f"{self.reference}_data", None) if datamodule is not None else None
        if self.data is None or (data is not None and data is not self.data):
            self.bind_datamodule(datamodule)

    def check(self, datamodule: Any, model: Any, comm: Comm = SINGLE) -> None:
        """ConfigError before training: no ``generate`` (or none taking ``num_steps``), a missing
        reference split, ``num_samples`` >= its size (same-law floors) or < the world size, an
        observable without one scalar per sample."""
        check_generate(model, self.settings.num_steps)
        self.bind_datamodule(datamodule)
        self.check_world(comm.world)

    def measure(self, model: Any, comm: Optional[Comm] = None) -> Measurement:
        """Sample this process's seeds, gather the observables through ``comm``: the values of
        :meth:`measure_rows` (the same on every process) and the density figure ``density``."""
        comm = TorchDistributed() if comm is None else comm
        rows = self.observe_rows(self.sample(model, comm.shard(self.seeds())))
        rows = comm.gather_rows(rows, self.settings.num_samples).cpu()
        obs = rows[:, 0]
        vals = self.measure_rows(rows)
        return Measurement(dict(vals), history=dict(vals),
                           figures={"density": lambda epoch: (self.density_figure(obs, f"epoch {epoch}"), None)},
                           nonfinite=NonFinite(vals["nonfinite"], "sample observables", ["rmsqe", "loader"]))

    # ------------------------------------------------------------------ checks
    @property
    def n_ref(self) -> int:
        return int(len(self.data))

    def check_world(self, world_size: int = 1) -> None:
        """ConfigError for what cannot work with this data (evaluates the observable on two
        reference fields only): ``num_samples`` >= n_ref (the floors split the reference into
        ``num_samples`` stand-in samples and a non-empty rest), fewer samples than processes,
        an observable that does not give one scalar per field."""
        s = self.settings
        self.check_sizes()
        if s.num_samples < int(world_size):
            raise ConfigError("num_samples", "every rank needs at least one sample (world size "
                              f"{world_size})", value=s.num_samples)
        check_on_samples(self.observe, self.data, "observable", output="scalars", value=s.observable)

    def check_sizes(self) -> None:
        """ConfigError unless ``num_samples`` < n_ref (needed by the same-law floors)."""
        n, n_ref = self.settings.num_samples, self.n_ref
        if not n < n_ref:
            raise ConfigError("num_samples", f"the same-law floors split the {n_ref} reference "
                              "samples into num_samples stand-in generated samples and a non-empty "
                              f"rest, so num_samples must be smaller than {n_ref}", value=n,
                              accepted=f"an integer in [2, {n_ref - 1}]",
                              suggestion=f"use num_samples <= {n_ref - 1} (e.g. {n_ref // 2}) "
                              "or more reference data")

    # ------------------------------------------------------------------ observables
    def observe(self, x: torch.Tensor, inverse_transform: Optional[Callable] = None,
                chunk: int = 1024) -> torch.Tensor:
        """Observable of fields ``x`` (model space) in physical units: float64 (B,), x's device."""
        inv = inverse_transform or self.inverse_transform
        outs = [self.observable((inv(c) if inv is not None else c).to(torch.float64))
                for c in x.split(int(chunk))]
        return torch.cat(outs).to(torch.float64)

    @property
    def value_range(self) -> tuple:
        """(lo, hi): the data range in model space (given, or the reference's min and max)."""
        if self._value_range is None:
            d = torch.as_tensor(self.data)
            self._value_range = (float(d.min()), float(d.max()))
        return self._value_range

    def observe_rows(self, x: torch.Tensor, inverse_transform: Optional[Callable] = None,
                     chunk: int = 1024) -> torch.Tensor:
        """Per sample (float64 (B, 4), x's device): the observable, the observable of the sample
        clipped to ``value_range``, 1.0 when a value of the sample lies above the range (NaN
        counts as above) and 1.0 when one lies below it. Gather these rows over ranks, then
        :meth:`measure_rows`."""
        lo, hi = self.value_range
        above = ~(x <= hi).flatten(1).all(1)
        below = (x < lo).flatten(1).any(1)
        return torch.stack([self.observe(x, inverse_transform, chunk),
                            self.observe(x.clamp(lo, hi), inverse_transform, chunk),
                            above.to(torch.float64), below.to(torch.float64)], 1)

    @property
    def reference_observable(self) -> torch.Tensor:
        """Observable of the reference data (float64, CPU), computed once."""
        if self._ref is None:
            self._ref = self.observe(self.data).detach().cpu()
        return self._ref

    def metric_settings(self) -> Dict[str, dict]:
        """The explicit settings shared by the model scores and the floors: RMSQE's options
        and LOADER's bandwidth / absolute floor / window frozen on the full reference."""
        if self._metric_settings is None:
            self.check_sizes()
            self._metric_settings = {
                "rmsqe": self.settings.rmsqe_kwargs(),
                "loader": loader_settings(self.reference_observable, **self.settings.loader_kwargs())}
        return self._metric_settings

    def _split_args(self) -> tuple:
        s = self.settings
        return s.num_splits, s.split_seed, s.num_samples

    def floors(self) -> Dict[str, float]:
        """Same-law floors ``rmsqe_floor``, ``loader_floor`` (computed once, on the reference splits)."""
        if self._floors is None:
            st, ref = self.metric_settings(), self.reference_observable
            self._floors = {f"{m}_floor": float(same_law_floor(ref, m, *self._split_args(), **st[m]))
                            for m in METRICS}
        return dict(self._floors)

    # ------------------------------------------------------------------ sampling and scores
    def seeds(self) -> torch.Tensor:
        """The evaluation seeds ``seed_offset + arange(num_samples)`` (shard them over ranks)."""
        s = self.settings
        return torch.arange(s.seed_offset, s.seed_offset + s.num_samples)

    def sample(self, model: Any, seeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``model.generate(seeds, batch_size, [num_steps])`` without gradients (default: all
        the evaluation seeds)."""
        check_generate(model, self.settings.num_steps)
        with torch.no_grad():
            return model.generate(self.seeds() if seeds is None else seeds,
                                  **self.settings.generate_kwargs())

    def scores(self, observables: torch.Tensor) -> Dict[str, float]:
        """``rmsqe``, ``loader`` (matched to the floors) and ``nonfinite`` of all ``num_samples``
        sample observables (gathered from every rank, any order)."""
        obs = torch.as_tensor(observables).detach().to(torch.float64).reshape(-1).cpu()
        if obs.numel() != self.settings.num_samples:
            raise ConfigError("observables", f"need the observables of all num_samples = "
                              f"{self.settings.num_samples} samples (the floors' n_gen)",
                              value=obs.numel())
        finite = torch.isfinite(obs)
        out = {"nonfinite": float((~finite).sum()) / obs.numel()}
        if not bool(finite.any()) or (self.settings.nonfinite == "nan" and not bool(finite.all())):
            return {"rmsqe": math.nan, "loader": math.nan, **out}
        st, ref = self.metric_settings(), self.reference_observable
        for m in METRICS:
            out[m] = float(matched_score(obs[finite], ref, m, *self._split_args(), **st[m]))
        return {k: out[k] for k in ("rmsqe", "loader", "nonfinite")}

    def measure_observables(self, observables: torch.Tensor) -> Dict[str, float]:
        """:meth:`scores` and :meth:`floors` of given sample observables."""
        return {**self.scores(observables), **self.floors()}

    def top_share(self, observables: torch.Tensor) -> float:
        """Share of the (blog, matched) RMSQE due to its single largest per-sample contribution
        (:func:`~lightning_pfd.metrics.tails.matched_rmsqe_contributions`; NaN for the
        ``root_mean_levels`` variant, without finite observables, or with ``nonfinite="nan"``
        and a non-finite one)."""
        obs = torch.as_tensor(observables).detach().to(torch.float64).reshape(-1).cpu()
        finite = torch.isfinite(obs)
        s = self.settings
        if s.definition != "blog" or not bool(finite.any()) or \
                (s.nonfinite == "nan" and not bool(finite.all())):
            return math.nan
        st = self.metric_settings()["rmsqe"]
        return top_share(matched_rmsqe_contributions(
            obs[finite], self.reference_observable, *self._split_args(), eta=st["eta"],
            u_max=st["u_max"]))

    def diagnostics(self, rows: torch.Tensor) -> Dict[str, float]:
        """From :meth:`observe_rows` of all ``num_samples`` samples: ``rmsqe_clipped``,
        ``loader_clipped`` (the scores of the clipped samples), ``above_range`` / ``below_range``
        (fractions of samples with a value above / below ``value_range``) and
        ``rmsqe_top_share``."""
        rows = torch.as_tensor(rows).detach().to(torch.float64).cpu()
        clipped = self.scores(rows[:, 1])
        return {"rmsqe_clipped": clipped["rmsqe"], "loader_clipped": clipped["loader"],
                "above_range": float(rows[:, 2].mean()), "below_range": float(rows[:, 3].mean()),
                "rmsqe_top_share": self.top_share(rows[:, 0])}

    def measure_rows(self, rows: torch.Tensor) -> Dict[str, float]:
        """:meth:`scores`, :meth:`floors` and :meth:`diagnostics` of :meth:`observe_rows` output."""
        rows = torch.as_tensor(rows).detach().to(torch.float64).cpu()
        return {**self.measure_observables(rows[:, 0]), **self.diagnostics(rows)}

    def evaluate(self, model: Any) -> Dict[str, float]:
        """Sample ``model``, observe, score: rmsqe, loader, nonfinite, rmsqe_floor, loader_floor
        and the diagnostics (module docstring)."""
        if self.data is None:
            raise ConfigError("data", "no reference fields: pass data or call prepare(datamodule) first")
        return self.measure_rows(self.observe_rows(self.sample(model)))

    # ------------------------------------------------------------------ density plot (blog Fig. 9)
    def density_data(self, samples: Union[torch.Tensor, Mapping[str, torch.Tensor]],
                     num_points: int = 512) -> dict:
        """KDE curves of the data and of ``samples`` (observables; a tensor is labelled "model"),
        with LOADER's bandwidth: see :func:`kde_curves`."""
        curves = dict(samples) if isinstance(samples, Mapping) else {"model": samples}
        bw = self.metric_settings()["loader"]["bandwidth"]
        window = self.settings.window if isinstance(self.settings.window, tuple) else None
        return kde_curves({"data": self.reference_observable, **curves}, bw, num_points, window)

    def density_figure(self, samples: Union[torch.Tensor, Mapping[str, torch.Tensor]],
                       title: str = ""):
        """Matplotlib figure: log-scale KDE densities of data and model observables."""
        label = self.settings.observable
        return density_figure({f"observable: {label}": self.density_data(samples)}, title)


def kde_curves(curves: Mapping[str, torch.Tensor], bandwidth: float, num_points: int = 512,
               window: Optional[Sequence[float]] = None) -> dict:
    """Figure data: Gaussian KDEs (one ``bandwidth``) of the finite values of each curve.

    The first curve is the reference: the x range covers every finite value, cut at twice the
    reference's range beyond its extremes (wild outliers would squeeze the plot); the y range
    spans 1e-5 to 3 times the reference density's peak. Curves with fewer than 2 finite values
    are left out. Returns ``dict(x, densities={label: array}, ylim, window)``.
    """
    finite = {k: v[torch.isfinite(v)].to(torch.float64).cpu()
              for k, v in ((k, torch.as_tensor(v).reshape(-1)) for k, v in curves.items())}
    ref = next(iter(finite.values()))
    span = float(ref.max() - ref.min())
    lo = min(float(v.min()) for v in finite.values() if v.numel())
    hi = max(float(v.max()) for v in finite.values() if v.numel())
    lo, hi = max(lo, float(ref.min()) - 2.0 * span), min(hi, float(ref.max()) + 2.0 * span)
    xs = np.linspace(lo, hi, int(num_points))
    dens = {k: kde_density(v, xs, bandwidth) for k, v in finite.items() if v.numel() >= 2}
    peak = float(next(iter(dens.values())).max())
    return dict(x=xs, densities=dens, ylim=(peak * 1e-5, peak * 3),
                window=None if window is None else tuple(window))


def density_figure(panels: Mapping[str, dict], title: str = "", colors: Sequence[str] = (
        "k", "C1", "C3", "C2", "C4", "C5")):
    """One log-density panel per entry of ``panels`` (x label -> :func:`kde_curves` data)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.5), squeeze=False)
    for ax, (xlabel, d) in zip(axes[0], panels.items()):
        for (label, dens), c in zip(d["densities"].items(), colors):
            ax.plot(d["x"], dens, label=label, color=c, lw=1.2)
        ax.set_yscale("log")
        ax.set_ylim(*d["ylim"])
        if d.get("window") is not None:
            ax.axvspan(*d["window"], color="0.9", zorder=0, label="LOADER window")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density (KDE)")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
