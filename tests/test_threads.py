"""Thread choice on a shared CPU (lightning_pfd/threads.py)."""
import subprocess
import sys
import time

import pytest
import torch

from lightning_pfd.errors import ConfigError
from lightning_pfd.threads import (apply_threads, busy_cores, choose_threads, parse_threads,
                                   pop_threads_arg)


@pytest.mark.parametrize("cores,busy,expected", [(2, 0.0, 2), (2, 1.0, 1), (2, 1.6, 1), (2, 5.0, 1),
                                                  (16, 3.2, 13), (1, 0.9, 1)])
def test_auto_leaves_the_busy_cores_to_their_owners(cores, busy, expected):
    c = choose_threads(None, env={}, cores=cores, busy=busy)
    assert c.threads == expected
    assert f"{cores} usable" in c.reason and f"{busy:.1f} busy" in c.reason


def test_explicit_and_environment_take_precedence():
    assert choose_threads(3, env={"OMP_NUM_THREADS": "1"}, cores=2, busy=0).threads == 3
    c = choose_threads(None, env={"OMP_NUM_THREADS": "1"}, cores=2, busy=0)
    assert c.threads == 1 and c.reason == "OMP_NUM_THREADS"
    assert choose_threads(None, env={}, cores=2, busy=0).wait_policy == "PASSIVE"
    assert choose_threads(None, env={"OMP_WAIT_POLICY": "ACTIVE"}, cores=2, busy=0).wait_policy == "ACTIVE"
    assert "--threads N" in c.line()


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(ConfigError, match="--threads"):
        parse_threads(bad)
    assert parse_threads("auto") is None and parse_threads(None) is None and parse_threads("4") == 4


def test_pop_threads_arg_removes_both_spellings(monkeypatch):
    monkeypatch.delenv("LIGHTNING_PFD_THREADS", raising=False)
    argv = ["fit", "--threads", "1", "--trainer.max_epochs", "2"]
    assert pop_threads_arg(argv) == "1" and argv == ["fit", "--trainer.max_epochs", "2"]
    argv = ["fit", "--threads=auto"]
    assert pop_threads_arg(argv) == "auto" and argv == ["fit"]
    monkeypatch.setenv("LIGHTNING_PFD_THREADS", "2")
    assert pop_threads_arg(["fit"]) == "2"
    with pytest.raises(ConfigError, match="--threads"):
        pop_threads_arg(["fit", "--threads"])


def test_apply_sets_torch_threads_and_the_wait_policy(capsys):
    old = torch.get_num_threads()
    env = {}
    try:
        c = apply_threads("1", env=env)
        assert torch.get_num_threads() == 1 and c.threads == 1
        assert env["OMP_WAIT_POLICY"] == "PASSIVE"
        assert "1 CPU thread (" in capsys.readouterr().err
    finally:
        torch.set_num_threads(old)


def test_busy_cores_sees_a_busy_process():
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert busy_cores(probe_s=0.5) >= 0.5
    finally:
        p.kill()
        p.wait()


def test_cli_prints_the_choice_first_and_refuses_bad_values(capsys, monkeypatch):
    from lightning_pfd.cli import main

    old = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as e:
            main(["fit", "--threads", "1", "--print_config"])
        assert e.value.code in (0, None)
        cap = capsys.readouterr()
        assert cap.err.splitlines()[0].startswith("[lightning_pfd] 1 CPU thread (--threads")
        assert torch.get_num_threads() == 1
        assert "CPU thread" not in cap.out and "threads" not in cap.out  # --print_config output stays YAML
        assert main(["fit", "--threads", "0"]) == 2
        assert "--threads" in capsys.readouterr().err
    finally:
        torch.set_num_threads(old)
