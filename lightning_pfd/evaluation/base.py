"""The measurement contract shared by every evaluation (pure torch, no Lightning import).

An **evaluation** is a subclass of :class:`Evaluation` implementing

- ``prepare(datamodule, model, comm=SINGLE)``: build what does not change between measurements
  (fixed seeds, subsets, references, caches) from the datamodule (after its ``setup``) and the
  model; called before each measurement, so it must be cheap when nothing changed. It may use the
  collectives of ``comm`` (every process then calls it);
- ``measure(model, comm) -> Measurement``: measure ``model`` on this process's share of the work
  and return values that are already global (the same on every process).

The other members of the contract have defaults in :class:`Evaluation` that a subclass
overrides when it needs to: ``check(datamodule, model, comm)`` (raise before any work when the
setup cannot be measured), ``reset()``, ``leaves()`` (the value names ``measure`` returns, for the
monitors' duplicate-key check), ``key(leaf, name)`` and ``metric_keys(key)`` (the logged names
and their :class:`~lightning_pfd.keys.MetricKey`), ``state_key_args()`` (what distinguishes two
instances, for checkpoint state), ``state_dict()`` / ``load_state_dict(state)``, and the class
attributes ``default_name``, ``lower_is_better`` and ``history_under_leaf``.
:class:`~lightning_pfd.callbacks.EvaluationMonitor` runs any subclass on a schedule.

A :class:`Measurement` carries the logged ``values`` (a tensor is logged as it is, a Python float
as float32, Lightning's default), the per-unit values behind them (:class:`Units`: what
:mod:`lightning_pfd.analysis.per_unit` stores for standard errors and paired tests), values kept
in the history only, figures drawn on demand, and the fraction of non-finite units.

**Processes.** :class:`Comm` is the one collective abstraction: ``rank``, ``world`` and an
all-gather of equal shapes, from which :meth:`Comm.gather_rows` (strided shards back in the
global order, the ``[rank::world]`` convention of :mod:`lightning_pfd.evaluation.sharding`),
:meth:`Comm.gather_all` (shapes may differ: torchmetrics' ``dist_sync_fn``), :meth:`Comm.all_sum`
and :meth:`Comm.all_true` are derived; :meth:`Comm.reduce_sum` is the backend's all-reduce.
Implementations: :data:`SINGLE` (one process: every collective is the identity),
:class:`TorchDistributed` (``torch.distributed``) and :class:`StrategyCollective` (a Lightning /
Fabric strategy's public ``all_gather`` / ``reduce``; :func:`strategy_comm` builds it for a
Trainer). Every process must call the collectives in the same order; every evaluation takes its
processes as one ``Comm``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch

from ..errors import ConfigError, renamed_fields
from . import sharding

__all__ = ["Evaluation", "Measurement", "Units", "NonFinite", "Comm", "SingleProcess",
           "SINGLE", "TorchDistributed", "StrategyCollective", "strategy_comm", "distributed_world",
           "train_data_of", "bind_train_data"]


# ----------------------------------------------------------------------------- processes
class Comm:
    """The processes a measurement is split over. Subclasses give ``rank``, ``world`` and
    :meth:`all_gather_equal` (and may override :meth:`reduce_sum`); the rest is derived. Every
    collective is the identity on one process."""

    rank: int = 0
    world: int = 1

    def all_gather_equal(self, t: torch.Tensor) -> List[torch.Tensor]:
        """``t`` of every process (equal shapes), in rank order."""
        raise NotImplementedError

    def distributed(self) -> bool:
        return self.world > 1

    def shard(self, n_or_items: Any):
        """This process's part: ``arange(rank, n, world)`` for an integer ``n``, else
        ``items[rank::world]`` (a tensor's rows or a sequence)."""
        if isinstance(n_or_items, int) and not isinstance(n_or_items, bool):
            return sharding.shard_indices(n_or_items, self.rank, self.world)
        return sharding.shard(n_or_items, self.rank, self.world)

    def gather_rows(self, rows: torch.Tensor, n: Optional[int] = None) -> torch.Tensor:
        """All ``n`` rows in global order from this process's strided shard ``rows`` (``n``:
        the global row count, gathered when None)."""
        if self.world == 1:
            return rows
        if n is None:
            count = torch.tensor([rows.shape[0]], dtype=torch.long, device=rows.device)
            n = int(torch.stack(self.all_gather_equal(count)).sum())
        padded = sharding.pad_rows(rows.contiguous(), sharding.shard_size(n, 0, self.world))
        return sharding.gather_shards(self.all_gather_equal(padded), n, self.world)

    def gather_all(self, t: torch.Tensor, group: Any = None) -> List[torch.Tensor]:
        """``t`` of every process, shapes may differ (torchmetrics' ``dist_sync_fn`` contract)."""
        if self.world == 1:
            return [t]
        shape = torch.tensor(t.shape, dtype=torch.long, device=t.device)
        shapes = [tuple(int(v) for v in s) for s in self.all_gather_equal(shape)]
        top = [max(s[d] for s in shapes) for d in range(t.ndim)]
        padded = t.new_zeros(top)
        padded[tuple(slice(0, k) for k in t.shape)] = t
        parts = self.all_gather_equal(padded)
        return [p[tuple(slice(0, k) for k in s)] for p, s in zip(parts, shapes)]

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise float64 sum over processes, added in rank order (gathered, then summed)."""
        t = t.to(torch.float64)
        return t if self.world == 1 else torch.stack(self.all_gather_equal(t)).sum(0)

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise sum over processes by the backend's all-reduce (default: :meth:`all_sum`)."""
        return t if self.world == 1 else self.all_sum(t).to(t.dtype)

    def all_true(self, flag: bool, device: Any = None) -> bool:
        """``flag`` on every process (a sum of the failures)."""
        failures = torch.tensor([0.0 if flag else 1.0], dtype=torch.float64, device=device)
        return float(self.all_sum(failures)[0]) == 0.0


class SingleProcess(Comm):
    """One process: every collective is the identity."""

    def all_gather_equal(self, t: torch.Tensor) -> List[torch.Tensor]:
        return [t]


#: the one-process :class:`Comm`
SINGLE = SingleProcess()


def distributed_world() -> int:
    """The ``torch.distributed`` world size (1 when it is not available or not initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


class TorchDistributed(Comm):
    """``torch.distributed`` (one process when it is not initialised)."""

    def __init__(self):
        import torch.distributed as dist

        self.world = distributed_world()
        self.rank = dist.get_rank() if self.world > 1 else 0

    def all_gather_equal(self, t: torch.Tensor) -> List[torch.Tensor]:
        if self.world == 1:
            return [t]
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous())
        return parts

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the processes by ``all_reduce`` (a copy; ``t`` itself on one)."""
        if self.world == 1:
            return t
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t)
        return t


def train_data_of(datamodule: Any, who: str) -> torch.Tensor:
    """``datamodule.train_data`` (the datamodule contract, after ``setup``), non-empty; ``who``
    names the evaluation that needs it."""
    data = getattr(datamodule, "train_data", None) if datamodule is not None else None
    if data is None:
        raise ConfigError("data", f"{who} needs a datamodule exposing `train_data` after setup()",
                          suggestion="pass datamodule=... to trainer.fit (every lightning_pfd datamodule "
                                     "exposes train_data)")
    if len(data) == 0:
        raise ConfigError("data", "the training set is empty", value=tuple(data.shape))
    return data


def bind_train_data(evaluation: Any, datamodule: Any, bind: Callable[[torch.Tensor], None]) -> None:
    """``bind(datamodule.train_data)`` unless ``evaluation.train_data`` is already that tensor (or
    there is no datamodule and it has one); a refusal of ``train_data`` names ``data`` (the
    datamodule's training set)."""
    if datamodule is None and evaluation.train_data is not None:
        return
    data = train_data_of(datamodule, type(evaluation).__name__)
    if data is not evaluation.train_data:
        with renamed_fields({"train_data": "data"}):
            bind(data)


class StrategyCollective(Comm):
    """A Lightning / Fabric strategy through its public API: ``all_gather(tensor) -> (world, ...)``
    and ``reduce(tensor, reduce_op="sum")``. ``strategy_fn`` returns the strategy when needed."""

    def __init__(self, strategy_fn: Callable[[], Any], rank: int, world: int):
        self._strategy_fn, self.rank, self.world = strategy_fn, int(rank), max(1, int(world))

    def all_gather_equal(self, t: torch.Tensor) -> List[torch.Tensor]:
        if self.world == 1:
            return [t]
        return list(self._strategy_fn().all_gather(t.contiguous()))

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.world == 1 else self._strategy_fn().reduce(t, reduce_op="sum")

    def __getstate__(self) -> dict:
        """Rank and world only: a spawned process (``ddp_spawn``) prepares its evaluations again
        with its own trainer's Comm; the copy refuses to communicate."""
        return {"rank": self.rank, "world": self.world}

    def __setstate__(self, state: dict) -> None:
        self.rank, self.world, self._strategy_fn = state["rank"], state["world"], _pickled_strategy


def _pickled_strategy():
    raise RuntimeError("this Comm was copied to another process (pickled): use the Comm of that "
                       "process's trainer (strategy_comm), as EvaluationMonitor.prepare does")


def strategy_comm(trainer: Any) -> StrategyCollective:
    """The :class:`Comm` of a Lightning Trainer (``trainer.strategy``, its global rank and world)."""
    return StrategyCollective(lambda: trainer.strategy, int(getattr(trainer, "global_rank", 0)),
                              max(1, int(getattr(trainer, "world_size", 1))))


# ----------------------------------------------------------------------------- results
@dataclass
class Units:
    """The per-unit values behind one logged value (:mod:`lightning_pfd.analysis.per_unit`).

    ``kind``: one of :data:`lightning_pfd.analysis.per_unit.KINDS` (``sq_dist``: per-seed squared
    distances, the value is sqrt(mean); ``indicator`` / ``mean``: the value is their mean;
    ``jackknife``: delete-a-group replicates); ``values`` and ``ids`` (the unit ids: seeds, sample
    indices, groups), 1-D of one length, global; ``value``: the logged value (default: the
    measurement's value of the same leaf)."""

    kind: str
    values: torch.Tensor
    ids: torch.Tensor
    value: Optional[float] = None


@dataclass
class NonFinite:
    """``fraction`` of the measured units that were NaN/inf (``what`` they are) and the leaves
    that are NaN because of them (one warning per fit names them)."""

    fraction: float
    what: str
    leaves: List[str] = field(default_factory=list)


@dataclass
class Measurement:
    """What one :meth:`Evaluation.measure` returns (the same on every process).

    Attributes:
        values: leaf -> value to log (a tensor is logged as it is, a Python number as float32).
        units: leaf -> :class:`Units` (per-unit values kept in the run's ``per_unit/``).
        history: leaf -> number kept in the monitor's history only (not logged).
        figures: leaf -> ``draw(epoch) -> (figure, caption or None)``, called on rank 0 only
            when the monitor's figure schedule is due.
        nonfinite: the non-finite units (None: the evaluation does not count them).
        raw: the evaluation's own result object (e.g. a FlowResult), for callers who need more.
        warnings: sentences about the measurement's validity (e.g. too few images for the
            feature dimension); a monitor prints each once per fit (rank 0).
        collapsed: why the model's outputs have collapsed (constant or zero features), None when
            they have not: a monitor logs its values as NaN and declares the model diverged.
    """

    values: Dict[str, Union[torch.Tensor, float]]
    units: Dict[str, Units] = field(default_factory=dict)
    history: Dict[str, float] = field(default_factory=dict)
    figures: Dict[str, Callable[[int], Tuple[Any, Optional[str]]]] = field(default_factory=dict)
    nonfinite: Optional[NonFinite] = None
    raw: Any = None
    warnings: List[str] = field(default_factory=list)
    collapsed: Optional[str] = None


class Evaluation:
    """The measurement contract (module docstring), every member but two with its default.

    A subclass implements ``prepare(datamodule, model, comm: Comm = SINGLE) -> None`` and
    ``measure(model, comm: Comm = SINGLE) -> Measurement``. A monitor always passes its
    trainer's ``comm``; the built-in evaluations' ``measure`` called without one uses
    :class:`TorchDistributed` (the processes of ``torch.distributed`` when it is initialized,
    else this process alone). A monitor reads every other member directly (no probing)."""

    #: the monitor's namespace when it is given no ``name`` (None: the leaves are the keys)
    default_name: Optional[str] = None
    #: leaf -> True when lower is better, for keys the built-in set does not know
    lower_is_better: Mapping[str, bool] = {}
    #: the measurement's ``history`` entries are kept under their bare leaf (not namespaced)
    history_under_leaf: bool = False

    def prepare(self, datamodule, model, comm=SINGLE) -> None:
        raise NotImplementedError(f"{type(self).__name__}.prepare(datamodule, model, comm)")

    def measure(self, model, comm=SINGLE) -> "Measurement":
        raise NotImplementedError(f"{type(self).__name__}.measure(model, comm)")

    def check(self, datamodule, model, comm=SINGLE) -> None:
        """Raise a ConfigError before any work when this setup cannot be measured (default: none)."""

    def reset(self) -> None:
        """Forget what :meth:`prepare` bound (another datamodule or model follows; default: nothing)."""

    def leaves(self) -> List[str]:
        """The value names :meth:`measure` returns (default: unknown, ``[]``)."""
        return []

    def key(self, leaf: str, name: Optional[str]) -> str:
        """The logged name of ``leaf`` under the monitor's ``name``: ``<name>/<leaf>``."""
        return leaf if name is None else f"{name}/{leaf}"

    def metric_keys(self, key: Callable[[str], str]) -> Optional[list]:
        """The :class:`~lightning_pfd.keys.MetricKey` of each leaf (``key``: leaf -> logged name);
        None: the monitor's rule (built-in keys renamed, else new keys with
        :attr:`lower_is_better`)."""
        return None

    def state_key_args(self) -> Dict[str, Any]:
        """What tells two instances apart in the checkpoint's state key (default: nothing)."""
        return {}

    def state_dict(self) -> Dict[str, Any]:
        """State kept in the monitor's checkpoint entry (default: none)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (default: nothing to restore)."""
