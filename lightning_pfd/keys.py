"""The logged metric names: what each means and who reads it.

A :class:`MetricKey` says, once, everything the rest of the project needs to know about a logged
name: its display name (progress bar, report), whether lower is better (the W&B summary defaults
to ``min,last`` or ``max,last`` from it), its family (``group``: the W&B glob ``<group>/*`` on the
epoch axis), its role in the event analysis (``role``: which curve of
:func:`lightning_pfd.analysis.events.analyze_history` it is), the event detectors that read it
(``detectors``) and whether the progress bar shows it.

A :class:`KeySet` is an immutable collection of keys. :data:`BUILTIN` holds the keys of the
shipped metrics; nothing changes it after import. The keys of a run are collected, not
registered: every callback that logs metrics declares them with a ``metric_keys()`` method (a
monitor with its own namespace returns its renamed keys; a flow metric's key comes from its class,
:meth:`MetricKey.from_metric`), and :func:`collect` builds ``BUILTIN`` plus those keys from the
trainer's callbacks at setup. The consumers take a :class:`KeySet` (default :data:`BUILTIN`):

- :func:`lightning_pfd.callbacks.wandb_setup.setup_wandb_metrics` (``define_metric``: epoch axis,
  summaries),
- :class:`lightning_pfd.callbacks.progress.PFDProgressBar` (the keys with ``progress_bar=True``),
- :mod:`lightning_pfd.analysis.events` (the role → key map, and the detectors run on user keys),
- :mod:`lightning_pfd.analysis.report` (display names, direction).

Two declarations of one name must agree (a different definition is a
:class:`~lightning_pfd.errors.ConfigError`), so two metrics cannot silently share a curve. Pure
Python (no torch, no Lightning).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .errors import ConfigError

__all__ = ["MetricKey", "KeySet", "BUILTIN", "collect", "get", "find", "all_keys",
           "groups", "roles", "summaries", "progress_bar_keys", "display", "slug",
           "ROLES", "DETECTORS", "CURVE_DETECTORS", "SUMMARY_OPS", "KINDS", "register_detector_name",
           "unregister_detector_name", "known_detectors"]

#: curves of the event analysis (:func:`lightning_pfd.analysis.events.analyze_history`)
ROLES = ("e_gen", "e_mem", "loss_train", "loss_test", "gap", "icr", "mem_ratio")
#: event detectors (:mod:`lightning_pfd.analysis.events`); on a user key (one without a role) the
#: single-curve ones run on that curve alone: early_learning, double_descent, minimum and
#: memorization_onset (the key is then a declared memorization signal)
DETECTORS = ("early_learning", "double_descent", "icr_minimum", "memorization_onset", "regime",
             "minimum")
#: single-curve detectors that run on a user key
CURVE_DETECTORS = ("early_learning", "double_descent", "minimum", "memorization_onset")
#: names of user event detectors (:func:`lightning_pfd.analysis.detectors.register_detector`
#: registers the function and its name here, so that a key may declare it)
_USER_DETECTORS: dict = {}


def register_detector_name(name: str, where: str) -> None:
    """Accept ``name`` in :attr:`MetricKey.detectors` (``where``: the function, for messages).
    A built-in name or one registered from elsewhere is a ConfigError."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigError("detector name", "must be lower-case letters, digits and '_', starting with a letter",
                          value=name)
    if name in DETECTORS:
        raise ConfigError("detector name", "is a built-in detector", value=name,
                          suggestion="choose another name for your detector")
    if _USER_DETECTORS.get(name, where) != where:
        raise ConfigError("detector name", f"is already registered by {_USER_DETECTORS[name]}", value=name)
    _USER_DETECTORS[name] = where


def unregister_detector_name(name: str) -> None:
    """Forget a registered user detector name (:func:`register_detector_name`)."""
    _USER_DETECTORS.pop(name, None)


def known_detectors() -> list:
    """The built-in detector names and the registered user ones."""
    return list(DETECTORS) + sorted(_USER_DETECTORS)
#: what ``define_metric(summary=...)`` accepts (comma-separated)
SUMMARY_OPS = ("min", "max", "mean", "last", "best", "first", "none")
#: what is logged under the key: a number per evaluation, or an image
KINDS = ("scalar", "image")

_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


@dataclass(frozen=True)
class MetricKey:
    """One logged metric name and what it means.

    Args:
        key: the logged name, ``<group>/<leaf>`` (e.g. ``pfd/e_gen``).
        display: short label (progress bar, report tables), e.g. ``E_gen``.
        lower_is_better: True / False, or None when the direction is not a quality (counts,
            diagnostics, E_mem whose meaning depends on the regime).
        group: the metric family; default: the part of ``key`` before the first ``/``.
        detectors: the event detectors that read this curve (names in :data:`DETECTORS`).
        role: its curve in the event analysis (one of :data:`ROLES`; at most one key per role).
        summary: W&B summary (``"min,last"``...); default from ``lower_is_better``
            (``min,last`` / ``max,last``; none when the direction is None).
        progress_bar: show it in :class:`~lightning_pfd.callbacks.progress.PFDProgressBar`.
        kind: ``"scalar"`` (default) or ``"image"`` (a figure logged under this key).
        description: one line for the report and the docs.
    """

    key: str
    display: str = ""
    lower_is_better: Optional[bool] = None
    group: str = ""
    detectors: Tuple[str, ...] = ()
    role: Optional[str] = None
    summary: Optional[str] = None
    progress_bar: bool = False
    kind: str = "scalar"
    description: str = ""

    def __post_init__(self) -> None:
        field = f"keys[{self.key!r}]"
        if not isinstance(self.key, str) or not _KEY_RE.match(self.key):
            raise ConfigError("keys.key", "a metric name is one or more '/'-separated parts of "
                              "letters, digits, '_', '.', '-'", value=self.key,
                              accepted="e.g. 'pfd/e_gen' or 'sw/e_gen'")
        if not isinstance(self.display, str):
            raise ConfigError(f"{field}.display", "must be a string", value=self.display)
        if self.lower_is_better is not None and not isinstance(self.lower_is_better, bool):
            raise ConfigError(f"{field}.lower_is_better", "must be True, False or None",
                              value=self.lower_is_better)
        detectors = (self.detectors,) if isinstance(self.detectors, str) else tuple(self.detectors)
        for d in detectors:
            if d not in DETECTORS and d not in _USER_DETECTORS:
                raise ConfigError(f"{field}.detectors", "unknown event detector", value=d,
                                  accepted=known_detectors(),
                                  suggestion="a detector of your own is registered with "
                                  "lightning_pfd.analysis.register_detector before the key is declared")
        if self.role is not None and self.role not in ROLES:
            raise ConfigError(f"{field}.role", "unknown role in the event analysis",
                              value=self.role, accepted=list(ROLES))
        if self.summary is not None:
            ops = [s.strip() for s in str(self.summary).split(",")]
            bad = [s for s in ops if s not in SUMMARY_OPS]
            if not isinstance(self.summary, str) or bad or not ops:
                raise ConfigError(f"{field}.summary", "must be comma-separated W&B summaries",
                                  value=self.summary, accepted=list(SUMMARY_OPS))
        if self.kind not in KINDS:
            raise ConfigError(f"{field}.kind", "unknown kind", value=self.kind, accepted=list(KINDS))
        object.__setattr__(self, "detectors", detectors)
        object.__setattr__(self, "display", self.display or self.key)
        object.__setattr__(self, "group", self.group or self.key.split("/", 1)[0])
        object.__setattr__(self, "progress_bar", bool(self.progress_bar))

    @property
    def wandb_summary(self) -> Optional[str]:
        """The W&B summary: ``summary`` if given, else from ``lower_is_better``."""
        if self.summary is not None:
            return None if self.summary == "none" else self.summary
        if self.lower_is_better is None or self.kind != "scalar":
            return None
        return "min,last" if self.lower_is_better else "max,last"

    def renamed(self, key: str, display: Optional[str] = None) -> "MetricKey":
        """The same definition under another name (a monitor with its own namespace), without
        the role (a role belongs to one key) and with the group of the new name."""
        return dataclasses.replace(self, key=key, display=display or key, group="", role=None)

    @classmethod
    def from_metric(cls, key: str, metric: Any) -> "MetricKey":
        """The key of a metric logged under ``key``, read from the metric's class (its one
        declaration): the direction from torchmetrics' ``higher_is_better`` (None: no
        direction), and the optional class attributes ``display_name``, ``detectors``,
        ``progress_bar``, ``summary``; the description is the first line of its docstring.
        ``metric`` is the class (or any callable that builds the metric), an instance or a
        ``functools.partial`` of either."""
        source = getattr(metric, "func", metric)
        hib = getattr(source, "higher_is_better", None)
        doc = (getattr(source, "__doc__", None) or "").strip().splitlines()
        return cls(key, display=getattr(source, "display_name", "") or key,
                   lower_is_better=None if hib is None else not hib,
                   detectors=getattr(source, "detectors", ()), summary=getattr(source, "summary", None),
                   progress_bar=bool(getattr(source, "progress_bar", False)),
                   description=doc[0] if doc else "")


class KeySet:
    """An immutable, ordered set of :class:`MetricKey` (one per name, at most one per role).

    ``KeySet(keys)`` refuses two different definitions of one name and a role held by two keys
    (:class:`~lightning_pfd.errors.ConfigError`); an identical definition twice is one key.
    :meth:`with_keys` returns a new set; nothing changes a set once built.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[MetricKey] = ()) -> None:
        table: Dict[str, MetricKey] = {}
        _add(table, keys)
        object.__setattr__(self, "_keys", MappingProxyType(table))

    def __setattr__(self, name, value):
        raise AttributeError("a KeySet is immutable: use with_keys()")

    def with_keys(self, *keys: MetricKey) -> "KeySet":
        """This set plus ``keys`` (checked as in the constructor)."""
        return KeySet([*self._keys.values(), *keys])

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        """The :class:`MetricKey` entries, in declaration order."""
        return iter(self._keys.values())

    def __eq__(self, other) -> bool:
        return isinstance(other, KeySet) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"KeySet({list(self._keys)})"

    def get(self, key: str) -> MetricKey:
        """The definition of ``key``; :class:`ConfigError` (with a close name) when unknown."""
        k = self._keys.get(key)
        if k is None:
            raise ConfigError("keys", "unknown metric name", value=key, accepted=sorted(self._keys))
        return k

    def find(self, key: str) -> Optional[MetricKey]:
        """The definition of ``key``, or None."""
        return self._keys.get(key)

    def all_keys(self, group: Optional[str] = None, kind: Optional[str] = "scalar") -> List[MetricKey]:
        """Keys in declaration order (of ``group`` / ``kind`` when given; ``kind=None``: every
        kind)."""
        return [k for k in self._keys.values()
                if (group is None or k.group == group) and (kind is None or k.kind == kind)]

    def groups(self) -> List[str]:
        """The metric families of the scalar keys (order of first declaration)."""
        return list(dict.fromkeys(k.group for k in self.all_keys()))

    def roles(self) -> Dict[str, str]:
        """{role: key} of the keys that hold a role in the event analysis."""
        return {k.role: k.key for k in self.all_keys() if k.role is not None}

    def summaries(self) -> Dict[str, str]:
        """{key: W&B summary} of the keys that have one."""
        return {k.key: k.wandb_summary for k in self.all_keys() if k.wandb_summary is not None}

    def progress_bar_keys(self) -> Dict[str, str]:
        """{display label: key} of the keys shown in the progress bar."""
        return {k.display: k.key for k in self.all_keys() if k.progress_bar}

    def display(self, key: str) -> str:
        """The display name of ``key`` (the key itself when unknown)."""
        k = self._keys.get(key)
        return key if k is None else k.display


def _add(table: Dict[str, MetricKey], keys: Iterable[MetricKey]) -> None:
    for k in keys:
        if not isinstance(k, MetricKey):
            raise ConfigError("keys", "a KeySet holds MetricKey objects", value=k)
        old = table.get(k.key)
        if old is not None and old != k:
            raise ConfigError(f"keys[{k.key!r}]", "is already declared with a different "
                              f"definition ({_diff(old, k)})", value=k.key,
                              suggestion="use another metric name, or the existing definition "
                              "(keys.get(name))")
        if k.role is not None:
            owner = next((o for o in table.values() if o.role == k.role and o.key != k.key), None)
            if owner is not None:
                raise ConfigError(f"keys[{k.key!r}].role", f"role {k.role!r} already belongs to "
                                  f"{owner.key!r} (one key per role)", value=k.role,
                                  suggestion="leave role unset and list the detectors instead")
        table[k.key] = k


def _diff(a: MetricKey, b: MetricKey) -> str:
    fields = [f.name for f in dataclasses.fields(MetricKey) if getattr(a, f.name) != getattr(b, f.name)]
    return ", ".join(f"{f}: {getattr(a, f)!r} vs {getattr(b, f)!r}" for f in fields[:3])


def collect(callbacks: Iterable[Any], base: Optional[KeySet] = None) -> KeySet:
    """``base`` (default :data:`BUILTIN`) plus the keys every object of ``callbacks`` declares
    with a ``metric_keys()`` method (the trainer's callbacks at setup); a conflict between two
    declarations is a :class:`~lightning_pfd.errors.ConfigError`."""
    declared = [k for cb in callbacks if callable(getattr(cb, "metric_keys", None))
                for k in cb.metric_keys()]
    return (BUILTIN if base is None else base).with_keys(*declared)


# the module-level queries read the built-in set
def get(key: str) -> MetricKey:
    """``BUILTIN.get(key)``."""
    return BUILTIN.get(key)


def find(key: str) -> Optional[MetricKey]:
    """``BUILTIN.find(key)``."""
    return BUILTIN.find(key)


def all_keys(group: Optional[str] = None, kind: Optional[str] = "scalar") -> List[MetricKey]:
    """``BUILTIN.all_keys(group, kind)``."""
    return BUILTIN.all_keys(group, kind)


def groups() -> List[str]:
    """``BUILTIN.groups()``."""
    return BUILTIN.groups()


def roles() -> Dict[str, str]:
    """``BUILTIN.roles()``."""
    return BUILTIN.roles()


def summaries() -> Dict[str, str]:
    """``BUILTIN.summaries()``."""
    return BUILTIN.summaries()


def progress_bar_keys() -> Dict[str, str]:
    """``BUILTIN.progress_bar_keys()``."""
    return BUILTIN.progress_bar_keys()


def display(key: str) -> str:
    """``BUILTIN.display(key)``."""
    return BUILTIN.display(key)


def higher_is_better(key: str) -> Optional[bool]:
    """torchmetrics' ``higher_is_better`` of the metric logged as built-in ``key``: the direction
    is declared once, in the table below (it must be known without importing torch), and the
    metric classes read it from here."""
    lower = BUILTIN.get(key).lower_is_better
    return None if lower is None else not lower


def slug(key: str) -> str:
    """``key`` as one identifier (``sw/e_gen`` -> ``sw_e_gen``), e.g. in event names."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")


# ----------------------------------------------------------------------------- built-in keys
def _builtin() -> List[MetricKey]:
    M = MetricKey
    out = [
        # generalization / memorization errors (PFD paper Def. 2, eq. 8)
        M("pfd/e_gen", "E_gen", True, detectors=("early_learning", "double_descent", "regime"),
          role="e_gen", progress_bar=True,
          description="PFD between student and teacher (data-distribution) flows"),
        M("pfd/e_mem", "E_mem", None, detectors=("memorization_onset", "regime"), role="e_mem",
          summary="min,last", progress_bar=True,
          description="PFD between student and empirical (training-set) flows"),
        M("pfd/e_gen_se", "se(E_gen)", None, description="standard error of E_gen over the seeds (delta method)"),
        M("pfd/e_mem_se", "se(E_mem)", None, description="standard error of E_mem over the seeds (delta method)"),
        M("pfd/nonfinite", "PFD non-finite", None, description="fraction of non-finite endpoints"),
        M("pfd/samples", "samples", kind="image", description="student / teacher / empirical rows"),
        # frozen-noise losses (PFD paper App. C.6)
        M("loss/train_fixed", "ℓ_train", True, detectors=("regime",), role="loss_train",
          description="denoising loss on the training set, frozen noise"),
        M("loss/test_fixed", "ℓ_test", True, detectors=("regime",), role="loss_test",
          description="denoising loss on held-out data, frozen noise"),
        M("loss/gap", "ℓ_test − ℓ_train", None, detectors=("regime",), role="gap",
          description="generalization gap of the frozen-noise losses"),
        M("val/loss", "val loss", True, description="validation denoising loss"),
        M("val/loss_median", "val loss median", True, description="median validation loss (Lévy)"),
        # invariant contamination ratio (ICR paper eq. 3-5, two-view estimator App. B.6)
        M("icr/icr", "ICR", True, detectors=("icr_minimum", "memorization_onset"), role="icr",
          progress_bar=True, description="invariant contamination ratio 1/(1 + Tr((Σ_ξ+τI)⁻¹Σ_s)/d), ICR paper eq. 5"),
        M("icr/icr_se", "se(ICR)", None, description="delete-a-group jackknife standard error of ICR"),
        M("icr/trace_s", "Tr Σ_s", None, description="trace of the semantic covariance"),
        M("icr/trace_xi", "Tr Σ_ξ", None, description="trace of the nuisance covariance"),
        M("icr/n", "ICR images", None, description="images in the ICR subset"),
        M("icr/d", "ICR dim", None, description="feature dimension after projection"),
        M("icr/nonfinite", "ICR non-finite", None, description="fraction of non-finite features"),
        M("icr/best_epoch", "ICR best epoch", None, description="epoch of the smoothed ICR minimum"),
        M("icr/rise_z", "ICR rise z", None, description="z of the ICR rise over its best value (ICREarlyStopping min_rise_z)"),
        # memorization ratio (ICR paper footnote 4)
        M("mem/ratio", "mem", True, detectors=("memorization_onset", "regime"), role="mem_ratio",
          summary="max,last", progress_bar=True,
          description="fraction of samples that copy a training example"),
        M("mem/ratio_se", "se(mem)", None, description="standard error of the memorization ratio"),
        M("mem/nonfinite", "mem non-finite", None, description="fraction of non-finite samples"),
        # tails of a physical observable (heavy-tailed diffusion blog post: RMSQE, LOADER)
        M("tail/rmsqe", "RMSQE", True, description="root mean squared quantile error"),
        M("tail/loader", "LOADER", True, description="log absolute density ratio"),
        M("tail/rmsqe_floor", "RMSQE floor", None, description="RMSQE between data splits"),
        M("tail/loader_floor", "LOADER floor", None, description="LOADER between data splits"),
        M("tail/nonfinite", "tail non-finite", None, description="fraction of non-finite samples"),
        M("tail/rmsqe_clipped", "RMSQE (clipped)", True,
          description="RMSQE of the samples clipped to the data range"),
        M("tail/loader_clipped", "LOADER (clipped)", True,
          description="LOADER of the samples clipped to the data range"),
        M("tail/above_range", "tail above range", None,
          description="fraction of samples with a value above the data range"),
        M("tail/below_range", "tail below range", None,
          description="fraction of samples with a value below the data range"),
        M("tail/rmsqe_top_share", "RMSQE top share", None,
          description="share of the RMSQE from its largest single-sample contribution"),
        M("tail/density", "tail density", kind="image", description="KDE of the observable"),
        # events (RegimeMonitor)
        M("events/regime_code", "regime", None,
          description="0 generalization, 1 transition, 2 memorization"),
        M("events/memorization_lead_epochs", "ICR lead", None,
          description="memorization onset minus ICR minimum, in epochs"),
    ]
    for ev in ("early_learning", "double_descent", "icr_minimum", "memorization_onset"):
        out += [M(f"events/{ev}_epoch", f"{ev} epoch", None),
                M(f"events/{ev}_significance", f"{ev} significance", None)]
    return out


#: the keys of the shipped metrics (immutable)
BUILTIN = KeySet(_builtin())
