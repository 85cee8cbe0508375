"""CPU threads that degrade gracefully on a shared machine.

PyTorch's CPU kernels run on an OpenMP pool with one thread per core by default, and GNU OpenMP
threads *spin* while they wait for the next parallel region. When another process keeps a core
busy, every parallel region waits for the thread that shares a core with it, and the spinning
threads steal the time that thread needs, so a run can be several times slower with one thread
per core than with fewer (``benchmarks/threads.py`` measures the options; docs/performance.md
records them). Two changes avoid the collapse:

* ``OMP_WAIT_POLICY=PASSIVE`` (set before torch is imported, unless the user set it): waiting
  threads sleep instead of spinning, so an oversubscribed pool costs at most what one thread
  would;
* ``auto`` threads = usable cores minus the cores other processes are busy on *now* (measured over
  ``probe_s`` from ``/proc/stat``; elsewhere the 1-minute load average), at least 1.

``--threads N`` (or ``LIGHTNING_PFD_THREADS=N``) fixes the number; ``OMP_NUM_THREADS`` set by the
user is respected as well. The choice is printed (stderr) as the run's first line.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Mapping, MutableMapping, Optional, Tuple

__all__ = ["ThreadChoice", "choose_threads", "busy_cores", "usable_cores", "pop_threads_arg",
           "apply_threads", "parse_threads"]

ENV_VAR = "LIGHTNING_PFD_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """The number of intra-op threads and why."""

    threads: int
    reason: str
    wait_policy: str

    def line(self) -> str:
        return (f"[lightning_pfd] {self.threads} CPU thread{'s' if self.threads != 1 else ''} "
                f"({self.reason}; OMP_WAIT_POLICY={self.wait_policy}); override with --threads N")


def usable_cores() -> int:
    """Cores this process may run on (affinity mask / cgroup-visible CPUs)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cpu_times(path: str = "/proc/stat") -> Optional[Tuple[int, int]]:
    """(busy, total) jiffies of all CPUs, or None where /proc/stat does not exist."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    total = sum(v[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def busy_cores(probe_s: float = 0.1, ncpu: Optional[int] = None) -> float:
    """Cores kept busy by *other* processes right now (this process is idle while it probes)."""
    ncpu = ncpu or (os.cpu_count() or 1)
    a = _cpu_times()
    if a is None:
        try:
            return float(os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0
    time.sleep(probe_s)
    b = _cpu_times()
    if b is None or b[1] <= a[1]:
        return 0.0
    return ncpu * (b[0] - a[0]) / (b[1] - a[1])


def parse_threads(value, field: str = "--threads") -> Optional[int]:
    """``None``/``"auto"`` → None (automatic), else a positive int (ConfigError otherwise)."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        return None
    from .errors import ConfigError

    try:
        n = int(str(value).strip())
    except ValueError:
        raise ConfigError(field, "must be a positive integer or 'auto'", value=value) from None
    if n < 1:
        raise ConfigError(field, "must be a positive integer or 'auto'", value=value)
    return n


def choose_threads(requested: Optional[int] = None, env: Mapping[str, str] = os.environ,
                   cores: Optional[int] = None, busy: Optional[float] = None) -> ThreadChoice:
    """The intra-op thread count: explicit request, then ``OMP_NUM_THREADS``, then automatic."""
    policy = env.get("OMP_WAIT_POLICY", "PASSIVE")
    if requested is not None:
        return ThreadChoice(int(requested), "--threads / LIGHTNING_PFD_THREADS", policy)
    if env.get("OMP_NUM_THREADS", "").strip():
        n = parse_threads(env["OMP_NUM_THREADS"], "OMP_NUM_THREADS")
        if n is not None:
            return ThreadChoice(n, "OMP_NUM_THREADS", policy)
    cores = usable_cores() if cores is None else int(cores)
    busy = busy_cores(ncpu=cores) if busy is None else float(busy)
    n = max(1, min(cores, cores - int(round(busy))))
    return ThreadChoice(n, f"auto: {cores} usable core{'s' if cores != 1 else ''}, "
                           f"{busy:.1f} busy with other processes", policy)


def pop_threads_arg(argv: list) -> Optional[str]:
    """Remove ``--threads N`` / ``--threads=N`` from ``argv``; return the value (or the env's)."""
    value = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--threads":
            if i + 1 >= len(argv):
                from .errors import ConfigError

                raise ConfigError("--threads", "expects a value", accepted=["auto", "1", "2", "..."])
            value = argv[i + 1]
            del argv[i:i + 2]
            continue
        if a.startswith("--threads="):
            value = a.split("=", 1)[1]
            del argv[i]
            continue
        i += 1
    return value if value is not None else os.environ.get(ENV_VAR)


def apply_threads(value=None, env: MutableMapping[str, str] = os.environ,
                  announce: bool = True) -> ThreadChoice:
    """Set the OpenMP wait policy (before torch is imported) and the intra-op thread count.

    Call before the first ``import torch`` of the process for the wait policy to take effect;
    ``torch.set_num_threads`` works at any time."""
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    choice = choose_threads(parse_threads(value), env)
    import torch

    torch.set_num_threads(choice.threads)
    if announce:
        print(choice.line(), file=sys.stderr, flush=True)  # stdout may be data (--print_config)
    return choice
