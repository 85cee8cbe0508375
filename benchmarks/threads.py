"""CPU threads on a shared machine: quickstart wall time per thread policy, idle and with one
busy process (issue: a 3-epoch quickstart took 79 s with torch's default threads and 18 s with 1
thread while another process kept a core busy).

    python benchmarks/threads.py [--epochs 2] [--repeats 1]

Runs ``python -m lightning_pfd fit`` (the embedded quickstart, ``--trainer.max_epochs E``, no
loggers' side effects kept: a temporary root dir) for each policy, interleaved, and prints a
markdown table; writes ``benchmarks/threads_result.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = {
    # name: (extra argv, env overrides)
    "torch default (2 threads, OMP spin)": (["--threads", "2"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": (["--threads", "1"], {}),
    "auto (default)": ([], {}),
}


def run_once(extra, env_over, epochs: int) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "LIGHTNING_PFD_THREADS", "WANDB_SERVICE")}
    env.update(env_over)
    env["WANDB_MODE"] = "disabled"
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "lightning_pfd", "fit", *extra, "--trainer.max_epochs", str(epochs),
               "--trainer.default_root_dir", d, "--trainer.logger", "false"]  # progress bar output discarded
        t = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    results = {}
    for load in ("idle", "one busy process"):
        hog = None
        if load != "idle":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for _ in range(args.repeats):
                for name, (extra, env) in POLICIES.items():
                    results.setdefault(load, {}).setdefault(name, []).append(run_once(extra, env, args.epochs))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    best = {load: {k: min(v) for k, v in r.items()} for load, r in results.items()}
    out = {"epochs": args.epochs, "cores": os.cpu_count(), "seconds": best}
    Path(__file__).with_name("threads_result.json").write_text(json.dumps(out, indent=2))
    print("| policy | idle (s) | one busy process (s) |\n|---|---|---|")
    for name in POLICIES:
        print(f"| {name} | {best['idle'][name]:.1f} | {best['one busy process'][name]:.1f} |")


if __name__ == "__main__":
    main()
