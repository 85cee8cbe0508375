"""Data safety: restricted CIFAR unpickling, value checks before training, resume-exact order."""
import io
import os
import pickle
import pickletools
import resource
import struct
import tarfile
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_pfd.data import (CIFAR10DataModule, DigitsDataModule, GaussianMixtureDataModule,
                                HeavyTailedFieldDataModule, PrecipitationDataModule,
                                TeacherDistillationDataModule, TensorDataModule,
                                TensorFileDataModule)
from lightning_pfd.data.base import (SeededPermutationSampler, SeededReplacementSampler,
                                     check_data, epoch_seed)
from lightning_pfd.data.cifar import safe_load_cifar_pickle
from lightning_pfd.errors import ConfigError

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


# ---------------------------------------------------------------------------------------------
# CIFAR-10: restricted unpickler
# ---------------------------------------------------------------------------------------------
class Py2Pickler(pickle._Pickler):
    """Writes what Python 2's cPickle (protocol 2) wrote for the official batches: every str as a
    py2 BINSTRING (read back with encoding="latin1") and numpy under ``numpy.core.multiarray``."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else bytes(obj)
        head = (pickle.SHORT_BINSTRING + bytes([len(raw)]) if len(raw) < 256
                else pickle.BINSTRING + struct.pack("<i", len(raw)))
        self.write(head + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str

    def save_global(self, obj, name=None):
        if obj is np.zeros(1).__reduce__()[0]:
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _official_batch(name, n=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"batch_label": f"{name} of 5", "labels": rng.integers(0, 10, n).tolist(),
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "filenames": [f"img_{i}.png" for i in range(n)]}


def _write_official(folder: Path, n=3):
    folder.mkdir(parents=True)
    batches = {}
    for k, name in enumerate(BATCHES):
        batches[name] = _official_batch(name, n, seed=k)
        with open(folder / name, "wb") as f:
            Py2Pickler(f, protocol=2).dump(batches[name])
    return batches


def _globals(blob: bytes) -> set:
    return {arg for op, arg, _ in pickletools.genops(blob) if op.name == "GLOBAL"}


def test_faithful_official_format_loads_and_references_only_numpy(tmp_path):
    batches = _write_official(tmp_path / "cifar-10-batches-py")
    blob = (tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes()
    assert blob[:2] == b"\x80\x02"  # protocol 2, like the official files
    assert _globals(blob) == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    dm = CIFAR10DataModule(root=str(tmp_path))
    dm.setup()
    data = np.concatenate([batches[n]["data"] for n in BATCHES[:5]])
    assert torch.allclose(dm.train_data.reshape(15, -1), torch.from_numpy(data).float() / 127.5 - 1)
    assert dm.val_labels.tolist() == batches["test_batch"]["labels"]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python3_pickles_of_a_batch_load(protocol):
    d = _official_batch("b")
    out = safe_load_cifar_pickle(io.BytesIO(pickle.dumps(d, protocol=protocol)), "mem")
    assert np.array_equal(out["data"], d["data"]) and out["labels"] == d["labels"]


def _os_system_payload(marker: Path) -> bytes:
    """Protocol 0: ``os.system("touch <marker>")`` called while unpickling."""
    return b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_payload_is_live_with_plain_pickle(tmp_path):
    """Guards the tests below: the payloads really run code under a plain pickle.load."""
    pickle.loads(_os_system_payload(tmp_path / "m1"))
    pickle.loads(pickle.dumps({"data": _Evil(tmp_path / "m2")}, protocol=2))
    assert (tmp_path / "m1").exists() and (tmp_path / "m2").exists()


def test_crafted_batch_file_is_refused_and_runs_nothing(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    _write_official(folder)
    marker = tmp_path / "pwned"
    (folder / "data_batch_1").write_bytes(_os_system_payload(marker))
    dm = CIFAR10DataModule(root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"data_batch_1.*'os\.system'") as e:
        dm.setup()
    assert e.value.field == "root"
    assert not marker.exists()


def test_crafted_tarball_member_is_refused_and_runs_nothing(tmp_path):
    folder = tmp_path / "src" / "cifar-10-batches-py"
    _write_official(folder)
    marker = tmp_path / "pwned"
    # the refused global comes after legitimate numpy data in the same stream
    evil = {"data": _official_batch("x")["data"], "labels": [0, 1, 2], "x": _Evil(marker)}
    (folder / "test_batch").write_bytes(pickle.dumps(evil, protocol=2))
    tgz = tmp_path / "t" / "cifar-10-python.tar.gz"
    tgz.parent.mkdir()
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    with pytest.raises(ConfigError, match=r"cifar-10-python\.tar\.gz:.*test_batch.*'posix\.system'"):
        CIFAR10DataModule(root=str(tmp_path / "t")).setup()
    assert not marker.exists()


@pytest.mark.parametrize("blob,match", [
    (b"cbuiltins\neval\n(S'1+1'\ntR.", "'builtins.eval'"),
    (b"c_codecs\nencode\n(S'x'\nS'rot13'\ntR.", "codec 'rot13' is not allowed"),
    (b"\x80\x02}q\x00(U\x04data", "not a readable CIFAR-10 python pickle"),
])
def test_other_refusals(blob, match):
    with pytest.raises(ConfigError, match=match):
        safe_load_cifar_pickle(io.BytesIO(blob), "f")


# ---------------------------------------------------------------------------------------------
# value checks
# ---------------------------------------------------------------------------------------------
def test_check_data_messages():
    check_data(torch.rand(5, 3) * 2 - 1, "train_data")  # fine
    check_data(torch.tensor([[1.0 + 1e-4, 0.5], [0.2, -1.0 - 1e-4]]), "train_data")  # inside the tolerance
    with pytest.raises(ConfigError, match=r"train_data.*every one of its 4 values is 0.3: a constant data set"):
        check_data(torch.full((2, 2), 0.3), "train_data")  # issue 40 item 11: refused, not trained on
    check_data(torch.full((1, 3), 0.3), "train_data")  # one sample: nothing to compare
    with pytest.raises(ConfigError, match=r"values in \[0, 255\]: divide by 127.5 and subtract 1 "
                                          r"to map to \[-1, 1\]"):
        check_data(torch.tensor([[0.0, 255.0], [3.0, 7.0]]), "train_data")
    with pytest.raises(ConfigError, match=r"values in \[0, 16\]: divide by 8 and subtract 1"):
        check_data(torch.tensor([0.0, 16.0]).reshape(2, 1), "train_data")
    with pytest.raises(ConfigError, match=r"outside the declared value_range \[-1, 1\]"):
        check_data(torch.tensor([[1.01]]), "train_data")
    x = torch.zeros(10, 4)
    x[3, 1], x[7, 0], x[7, 2] = float("nan"), float("inf"), -float("inf")
    for vr in ((-1, 1), None):  # the finite check also runs without a range
        with pytest.raises(ConfigError, match=r"val_data: contains 3 NaN/inf values \(of 40; the "
                                              r"first in sample 3\)"):
            check_data(x, "val_data", vr)
    check_data(torch.tensor([[-50.0, 1e6]]), "train_data", None)
    check_data(torch.tensor([[0.0, 255.0]]), "train_data", (0, 255))
    for bad in ((1, -1), (0, float("inf")), "x", (1, 2, 3)):
        with pytest.raises(ConfigError, match="value_range"):
            check_data(x, "train_data", bad)


def test_check_data_chunked_equals_whole_and_finds_first_bad_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(50, 3, 2, generator=g) * 2 - 1
    x[41, 2, 1] = 1.5
    msgs = []
    for chunk in (1, 7, 6 * 50, 1 << 22):
        with pytest.raises(ConfigError) as e:
            check_data(x, "train_data", chunk=chunk)
        msgs.append(str(e.value))
    assert len(set(msgs)) == 1 and "1.5]" in msgs[0]
    x[41, 2, 1] = float("nan")
    with pytest.raises(ConfigError, match="first in sample 41"):
        check_data(x, "train_data", chunk=7)


def test_check_data_does_not_copy_a_huge_tensor():
    """A 600 MB (virtual) expanded tensor: a whole-tensor copy or mask would show in the peak RSS."""
    x = torch.linspace(-1, 1, 1000).reshape(1, 1000).expand(150_000, 1000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    check_data(x, "train_data")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 150


class _Recorder(pl.LightningModule):
    def __init__(self, dim=2):
        super().__init__()
        self.lin = torch.nn.Linear(dim, 1)
        self.seen = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.setdefault(self.current_epoch, []).extend(y.tolist())
        return F.mse_loss(self.lin(x.flatten(1)), torch.zeros(len(x), 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(**kw):
    return pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", limit_val_batches=0, **kw)


def test_bad_data_raises_in_setup_before_any_training_step():
    pixels = torch.randint(0, 256, (8, 2)).float()
    model = _Recorder()
    with pytest.raises(ConfigError, match=r"train_data: .*divide by 127.5 and subtract 1"):
        _trainer(max_epochs=1).fit(model, TensorDataModule(pixels, pixels[:2], batch_size=4))
    assert model.seen == {}
    ok = torch.rand(8, 2) * 2 - 1
    bad_val = ok[:3].clone()
    bad_val[1, 0] = float("nan")
    with pytest.raises(ConfigError, match=r"val_data: contains 1 NaN/inf values"):
        TensorDataModule(ok, bad_val).setup()
    # float64 values that overflow float32 become inf: caught after the conversion
    with pytest.raises(ConfigError, match="NaN/inf"):
        TensorDataModule(torch.tensor([[1e300]], dtype=torch.float64), value_range=None).setup()
    with pytest.raises(ConfigError, match="value_range"):
        TensorDataModule(ok, value_range=(2, 1))


def test_tensorfile_float_pixels_get_a_rescaling_hint(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (10, 4)).astype(np.float32)
    x[0, 0], x[1, 0] = 0, 255
    np.savez(tmp_path / "px.npz", x=x)
    with pytest.raises(ConfigError, match=r"px\.npz are used as they are.*divide by 127\.5 and subtract 1"):
        TensorFileDataModule(str(tmp_path / "px.npz")).setup()
    np.savez(tmp_path / "ok.npz", x=x.astype(np.uint8))  # uint8: scaled automatically
    TensorFileDataModule(str(tmp_path / "ok.npz")).setup()
    x[4, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x=x / 127.5 - 1)
    with pytest.raises(ConfigError, match="contains 1 NaN/inf values"):
        TensorFileDataModule(str(tmp_path / "nan.npz"), val_fraction=0.0).setup()


def test_per_datamodule_default_ranges():
    assert TensorDataModule(torch.zeros(2, 1)).value_range == (-1.0, 1.0)
    assert DigitsDataModule().value_range == (-1.0, 1.0)
    assert PrecipitationDataModule(n_train=4, n_val=0).value_range == (-1.0, 1.0)
    assert GaussianMixtureDataModule(dim=2, n_train=4, n_val=4).value_range is None
    assert HeavyTailedFieldDataModule(size=4, n_train=4, n_val=4).value_range is None
    assert TeacherDistillationDataModule(n_train=4, n_test=4, n_gen=4).value_range is None
    # digits honour their declared range; heavy tails exceed [-1, 1] but are finite
    DigitsDataModule(image_size=16).setup()
    heavy = HeavyTailedFieldDataModule(size=8, n_train=64, n_val=4)
    heavy.setup()
    assert float(heavy.train_data.abs().max()) > 1


def test_precipitation_log_max_too_small_is_explained():
    dm = PrecipitationDataModule(crop_size=16, n_train=64, n_val=0, log_max=1.0)
    with pytest.raises(ConfigError, match=r"maps log_max = 1 mm/h to \+1: raise log_max"):
        dm.setup()


# ---------------------------------------------------------------------------------------------
# resume-exact order
# ---------------------------------------------------------------------------------------------
def test_permutation_sampler_is_a_pure_function_of_seed_and_epoch():
    a, b = SeededPermutationSampler(50, seed=3), SeededPermutationSampler(50, seed=3)
    orders = []
    for e in range(4):
        a.set_epoch(e), b.set_epoch(e)
        oa = list(a)
        assert oa == list(b) and sorted(oa) == list(range(50)) and len(a) == 50
        orders.append(tuple(oa))
    assert len(set(orders)) == 4
    a.set_epoch(1)
    assert tuple(a) == orders[1]  # going back: same order (no hidden generator state)
    assert tuple(SeededPermutationSampler(50, seed=4)) != orders[0]
    # seeds and epochs are decorrelated: run seed=1 does not replay run seed=0 one epoch later
    assert epoch_seed(0, 1) != epoch_seed(1, 0)
    r0, r1 = SeededReplacementSampler(50, 20, seed=0), SeededReplacementSampler(50, 20, seed=1)
    r0.set_epoch(1)
    assert list(r0) != list(r1)


def _labelled_dm(n=12, seed=0, **kw):
    x = torch.linspace(-1, 1, 2 * n).reshape(n, 2)
    return TensorDataModule(x, train_labels=torch.arange(n), batch_size=4, seed=seed, **kw)


def test_loaders_built_separately_agree_and_do_not_touch_the_global_rng():
    loaders = []
    for _ in range(2):
        dm = _labelled_dm(val_data=torch.zeros(3, 2))
        dm.setup()
        loaders.append(dm.train_dataloader())
    state = torch.get_rng_state()
    for e in (0, 5):
        seen = []
        for loader in loaders:
            loader.sampler.set_epoch(e)
            seen.append(torch.cat([y for _, y in loader]).tolist())
        assert seen[0] == seen[1] and sorted(seen[0]) == list(range(12))
    list(dm.val_dataloader())
    assert torch.equal(torch.get_rng_state(), state)


class _EpochProbe(pl.Callback):
    """Records the epoch Lightning set on the training sampler at each epoch start."""

    def __init__(self):
        self.epochs = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.epochs.append((trainer.current_epoch,
                            getattr(trainer.train_dataloader.sampler, "epoch", None)))


def test_resumed_run_sees_the_uninterrupted_order(tmp_path):
    full, probe_full = _Recorder(), _EpochProbe()
    _trainer(max_epochs=3, callbacks=[probe_full], enable_checkpointing=False).fit(full, _labelled_dm())
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    _trainer(max_epochs=1, callbacks=[ckpt]).fit(_Recorder(), _labelled_dm())
    resumed, probe = _Recorder(), _EpochProbe()
    _trainer(max_epochs=3, callbacks=[probe], enable_checkpointing=False).fit(
        resumed, _labelled_dm(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert sorted(resumed.seen) == [1, 2] and len({tuple(v) for v in full.seen.values()}) == 3
    assert resumed.seen[1] == full.seen[1] and resumed.seen[2] == full.seen[2]
    # Lightning calls set_epoch(epoch) on our sampler, also after the resume
    assert probe_full.epochs == [(0, 0), (1, 1), (2, 2)] and probe.epochs == [(1, 1), (2, 2)]


def test_permutation_sampler_survives_lightning_ddp_wrapping():
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler

    dm = _labelled_dm(n=10)
    dm.setup()
    loader = dm.train_dataloader()
    shards = []
    for rank in range(2):
        s = _get_distributed_sampler(loader, shuffle=True, overfit_batches=0, num_replicas=2, rank=rank)
        assert isinstance(s, DistributedSamplerWrapper)  # wrapped, not replaced
        s.set_epoch(4)
        assert loader.sampler.epoch == 4
        shards.append(list(s))
    assert sorted(shards[0] + shards[1]) == list(range(10))
