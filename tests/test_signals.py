"""SIGTERM / SIGINT: a stopped fit exits 143 / 130 (never 0), names the resumable checkpoint and the
command that resumes it; the resume finishes the run with every epoch logged once."""
from __future__ import annotations

import os
import signal

import pytest

from lightning_pfd.checkpoint import load_checkpoint
from lightning_pfd.launch.interrupts import _resume_command, signal_guard
from test_reliability import _cli, _env, _rows, _write_config


def _signal_at(step: int, signum: int) -> list:
    return ["--trainer.callbacks+=helpers.faults.SignalAtStep", "--trainer.callbacks.step", str(step),
            "--trainer.callbacks.signum", str(signum)]


def test_sigint_then_sigterm_exit_130_and_143_and_the_resume_finishes_the_run(tmp_path):
    """Real subprocesses, real signals (sent by the process to itself after an optimizer step, i.e.
    through the installed handlers): 4 epochs of 10 steps; SIGINT in epoch 1, SIGTERM in epoch 2
    of the resumed run, then a resume to the end."""
    env, d = _env(tmp_path), tmp_path / "run_dir"
    _write_config(d, epochs=4)
    r1 = _cli(d, env, *_signal_at(15, int(signal.SIGINT)), timeout=600)
    assert r1.returncode == 130, (r1.returncode, r1.stderr[-2000:])
    assert "stopped by SIGINT in epoch 1 (step 15); exit status 130" in r1.stderr
    assert "run/checkpoints/last.ckpt (end of epoch 0)" in r1.stderr
    assert "resume with: python -m lightning_pfd fit --config c.yaml" in r1.stderr
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["global_step"] == 10  # intact, verified

    r2 = _cli(d, env, "--ckpt_path", "last", *_signal_at(25, int(signal.SIGTERM)), timeout=600)
    assert r2.returncode == 143, (r2.returncode, r2.stderr[-2000:])
    assert "stopped by SIGTERM in epoch 2 (step 25); exit status 143" in r2.stderr
    assert "(end of epoch 1)" in r2.stderr and r2.stderr.count("--ckpt_path") == 1  # not repeated
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["global_step"] == 20

    r3 = _cli(d, env, "--ckpt_path", "last", timeout=600)
    assert r3.returncode == 0, r3.stderr[-2000:]
    assert load_checkpoint(d / "run/checkpoints/last.ckpt")["global_step"] == 40
    rows = _rows(d / "run/csv/version_0/metrics.csv")
    assert [r["epoch"] for r in rows if r.get("train/loss_epoch")] == ["0", "1", "2", "3"]
    assert sorted(p.name for p in (d / "run/csv").iterdir()) == ["version_0"]


def test_a_sigterm_outside_the_trainer_stops_at_once_with_143_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as info:
        with signal_guard() as rec:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_kill(signal.pthread_self(), 0)  # let the handler run here
            pytest.fail("not stopped")
    assert info.value.code == 143 and rec.signum == signal.SIGTERM and rec.exit_status == 143
    with pytest.raises(KeyboardInterrupt):
        with signal_guard() as rec:
            os.kill(os.getpid(), signal.SIGINT)
            signal.pthread_kill(signal.pthread_self(), 0)
            pytest.fail("not stopped")
    assert rec.exit_status == 130
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_resume_command_replaces_an_earlier_ckpt_path():
    assert _resume_command(["fit", "--config", "my run.yaml", "--ckpt_path", "x.ckpt", "--ckpt_path=y"],
                           "python -m lightning_pfd") == \
        "python -m lightning_pfd fit --config 'my run.yaml' --ckpt_path last"


_PEER = """
import os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
t = torch.ones(3)
dist.all_reduce(t)
if rank == 0:
    os._exit(9)  # rank 0 killed
time.sleep(0.5)
try:
    dist.all_reduce(t)
except RuntimeError as e:
    print(type(e).__name__ + "|" + str(e).replace(chr(10), " "))
"""


def test_a_rank_whose_peer_died_says_so_in_one_block(tmp_path, capsys):
    """Issue 40 item 13: DDP with rank 0 killed. The error rank 1 gets is gloo's real one (two
    processes here, 2 gloo ranks); the fit command turns it into one block naming the rank and
    the resume, exit status 1, instead of a traceback. A one-process run is not matched."""
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    from lightning_pfd.launch.interrupts import lost_peer, lost_peer_status

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "peer.py"
    script.write_text(_PEER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    zero = subprocess.Popen([sys.executable, str(script), "0", port], env=env)
    one = subprocess.run([sys.executable, str(script), "1", port], env=env, capture_output=True, text=True,
                         timeout=600)
    zero.wait(timeout=600)
    kind, message = one.stdout.strip().split("|", 1)
    error = RuntimeError(message)
    assert kind == "RuntimeError"
    ckpts = tmp_path / "ckpt"
    ckpts.mkdir()
    trainer = SimpleNamespace(world_size=2, global_rank=1, max_epochs=5, max_steps=-1,
                              checkpoint_callbacks=[SimpleNamespace(dirpath=str(ckpts))])
    assert lost_peer(error, trainer)
    assert not lost_peer(error, SimpleNamespace(world_size=1)) and not lost_peer(RuntimeError("a bug"), trainer)
    assert lost_peer_status(error, trainer, ["fit", "--config", "c.yaml"], "python -m lightning_pfd") == 1
    err = capsys.readouterr().err
    assert err.startswith("[lightning_pfd] rank 1 of 2 stopped: another process of this DDP run is gone")
    assert "Connection closed by peer" in err and "/gloo/" not in err
    assert "nothing to resume: no checkpoint was written yet" in err
    import torch

    torch.save({"epoch": 1, "global_step": 20, "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 2}}}}},
               ckpts / "last.ckpt")
    lost_peer_status(error, trainer, ["fit", "--config", "c.yaml"], "python -m lightning_pfd")
    err = capsys.readouterr().err
    assert f"resumable: {ckpts / 'last.ckpt'}; resume with: python -m lightning_pfd fit --config c.yaml --ckpt_path last" in err
