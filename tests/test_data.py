"""Tests for lightning_pfd.data (fast: tiny data, few solver steps)."""
import gzip
import hashlib
import pickle
import struct
import tarfile
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_pfd.cache import cache_dir
from lightning_pfd.data import (CIFAR10DataModule, DigitsDataModule, FashionMNISTDataModule,
                                GaussianMixtureDataModule, TeacherDistillationDataModule,
                                TensorDataModule, TensorFileDataModule)
from lightning_pfd.data.base import SeededReplacementSampler
from lightning_pfd.data.fashion import FASHION_FILES, read_idx
from lightning_pfd.diffusion import GaussianMixtureDenoiser, karras_sigmas, sample_endpoints


# ---------------------------------------------------------------------------------------------
# base: subsets, samplers, errors
# ---------------------------------------------------------------------------------------------
def _arange_dm(n=100, **kw):
    """Rows 0..n-1 (value = row index, so outside [-1, 1]: no range check)."""
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    return TensorDataModule(train_data=x, val_data=x[:5], value_range=None, **kw)


def test_subset_is_seeded_exact_and_distinct():
    a, b, c = _arange_dm(n_train=10, subset_seed=3), _arange_dm(n_train=10, subset_seed=3), \
        _arange_dm(n_train=10, subset_seed=4)
    for dm in (a, b, c):
        dm.setup()
    assert a.train_data.shape == (10, 1)
    vals = a.train_data.reshape(-1)
    assert len(set(vals.tolist())) == 10 and bool(((vals >= 0) & (vals < 100)).all())
    assert torch.equal(a.train_data, b.train_data) and a.fingerprint() == b.fingerprint()
    assert not torch.equal(a.train_data, c.train_data) and a.fingerprint() != c.fingerprint()
    assert torch.equal(a.train_data.reshape(-1).long(), a.train_indices)  # rows = indices here


def test_subset_of_digits_rows_come_from_the_training_split():
    full, sub = DigitsDataModule(), DigitsDataModule(n_train=64, subset_seed=1)
    full.setup(), sub.setup()
    assert sub.train_data.shape == (64, 1, 8, 8) and sub.train_labels.shape == (64,)
    assert torch.equal(sub.train_data, full.train_data[sub.train_indices])
    assert torch.equal(sub.train_labels, full.train_labels[sub.train_indices])


@pytest.mark.parametrize("bad", [0, -3, 1601, 10_000])
def test_bad_n_train_raises_at_construction(bad):
    with pytest.raises(ValueError, match=r"n_train.*\[1, 1600\]|n_train: must be an integer > 0"):
        DigitsDataModule(n_train=bad)


def test_bad_n_train_direct_tensor_and_gmm():
    with pytest.raises(ValueError, match=r"n_train: must be in \[1, 100\]"):
        _arange_dm(n_train=101)
    with pytest.raises(ValueError, match="n_train"):
        GaussianMixtureDataModule(n_train=0)
    with pytest.raises(ValueError, match="batch_size"):
        _arange_dm(batch_size=0)
    with pytest.raises(ValueError, match="image_size"):
        DigitsDataModule(image_size=12)


def test_replacement_sampler_seeded_per_epoch():
    s = SeededReplacementSampler(8, 100, seed=5)
    e0 = list(s)
    assert len(e0) == 100 == len(s) and set(e0) <= set(range(8))
    assert list(s) == e0  # same epoch -> same draws (resume-safe)
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    s.set_epoch(0)
    assert list(s) == e0
    # with replacement: 100 draws from 8 items must repeat
    assert len(set(e0)) <= 8


def test_samples_per_epoch_loader_length_and_labels():
    dm = _arange_dm(n=16, samples_per_epoch=40, batch_size=8)
    dm.setup()
    batches = list(dm.train_dataloader())
    assert len(batches) == 5 and sum(len(b[0]) for b in batches) == 40
    x, y = batches[0]
    assert y.dtype == torch.long and bool((y == -1).all())  # no labels -> -1
    assert len(list(dm.val_dataloader())) == 1


# ---------------------------------------------------------------------------------------------
# digits
# ---------------------------------------------------------------------------------------------
def test_digits_values_match_sklearn_and_range():
    from sklearn.datasets import load_digits

    dm = DigitsDataModule(n_val=200, split_seed=3)
    dm.setup()
    raw = torch.as_tensor(load_digits().images, dtype=torch.float32)
    allx = torch.cat([dm.train_data, dm.val_data]).reshape(-1, 64)
    assert allx.shape == (1797, 64) and dm.val_data.shape == (200, 1, 8, 8)
    assert allx.min() == -1.0 and allx.max() == 1.0
    # the union of the splits is exactly the dataset scaled as x/8 - 1 (as a multiset of rows)
    expect = (raw / 8 - 1).reshape(-1, 64)
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(allx) == key(expect)
    assert dm.data_shape == (1, 8, 8)


@pytest.mark.parametrize("size,resize", [(16, "bilinear"), (32, "pad"), (16, "pad")])
def test_digits_sizes(size, resize):
    dm = DigitsDataModule(image_size=size, resize=resize, n_train=32)
    dm.setup()
    assert dm.train_data.shape == (32, 1, size, size) and dm.data_shape == (1, size, size)
    assert dm.train_data.min() >= -1 and dm.train_data.max() <= 1
    if resize == "pad":
        native = DigitsDataModule(n_train=32)
        native.setup()
        o = (size - 8) // 2
        assert torch.equal(dm.train_data[:, :, o:o + 8, o:o + 8], native.train_data)
        border = dm.train_data.clone()
        border[:, :, o:o + 8, o:o + 8] = -1
        assert bool((border == -1).all())


def test_digits_as_vector():
    dm = DigitsDataModule(as_vector=True, n_train=10)
    dm.setup()
    assert dm.train_data.shape == (10, 64) and dm.data_shape == (64,)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST IDX
# ---------------------------------------------------------------------------------------------
def _write_idx(path: Path, arr: np.ndarray, code: int, gz: bool = True):
    dt = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">i", d) for d in arr.shape)
    raw = header + arr.astype(dt).tobytes()
    (gzip.open if gz else open)(path, "wb").write(raw)


def test_read_idx_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(3, 4, 5), dtype=np.uint8)
    _write_idx(tmp_path / "a.gz", a, 0x08)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), a)
    b = rng.integers(-1000, 1000, size=(7,)).astype(np.int32)
    _write_idx(tmp_path / "b", b, 0x0C, gz=False)  # big-endian int32 decoded correctly
    assert np.array_equal(read_idx(tmp_path / "b"), b)
    c = rng.standard_normal((2, 3)).astype(np.float32)
    _write_idx(tmp_path / "c.gz", c, 0x0D)
    assert np.array_equal(read_idx(tmp_path / "c.gz"), c)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">i", 5) + b"\x00\x01")
    with pytest.raises(ValueError, match="payload"):
        read_idx(tmp_path / "short")


def _fake_fashion(root: Path, n_train=12, n_test=6):
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    data = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, size=(n,), dtype=np.uint8)
        _write_idx(root / FASHION_FILES[f"{split}_images"], x, 0x08)
        _write_idx(root / FASHION_FILES[f"{split}_labels"], y, 0x08)
        data[split] = (x, y)
    return data


def test_fashion_datamodule_on_fake_idx(tmp_path):
    data = _fake_fashion(tmp_path / "fm")
    dm = FashionMNISTDataModule(root=str(tmp_path / "fm"))
    dm.setup()
    x, y = data["train"]
    assert dm.train_data.shape == (12, 1, 28, 28) and dm.val_data.shape == (6, 1, 28, 28)
    assert torch.allclose(dm.train_data[:, 0], torch.as_tensor(x, dtype=torch.float32) / 127.5 - 1)
    assert torch.equal(dm.train_labels, torch.as_tensor(y, dtype=torch.long))
    padded = FashionMNISTDataModule(root=str(tmp_path / "fm"), pad_to_32=True)
    padded.setup()
    assert padded.train_data.shape == (12, 1, 32, 32)
    assert torch.equal(padded.train_data[:, :, 2:30, 2:30], dm.train_data)


def test_fashion_missing_names_files_and_package(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        FashionMNISTDataModule(root=str(tmp_path / "nowhere"))
    msg = str(e.value)
    assert "nowhere" in msg and "train-images-idx3-ubyte.gz" in msg
    assert "apt-get install dataset-fashion-mnist" in msg


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists(),
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_real_data():
    dm = FashionMNISTDataModule(n_train=100)
    dm.setup()
    assert dm.train_data.shape == (100, 1, 28, 28) and dm.val_data.shape == (10_000, 1, 28, 28)
    assert dm.train_data.min() >= -1 and dm.train_data.max() <= 1


# ---------------------------------------------------------------------------------------------
# CIFAR-10
# ---------------------------------------------------------------------------------------------
def _fake_cifar_batches(folder: Path, per_batch=3):
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
             "labels": rng.integers(0, 10, size=per_batch).tolist(), "batch_label": name}
        with open(folder / name, "wb") as f:
            pickle.dump(d, f)
        batches[name] = d
    return batches


def _expected_cifar(batches, names):
    data = np.concatenate([batches[n]["data"] for n in names])
    # independent decoding: pixel (c, h, w) of image i is data[i, c*1024 + h*32 + w]
    i, c, h, w = 1, 2, 5, 7
    return data, torch.tensor(float(data[i, c * 1024 + h * 32 + w]) / 127.5 - 1), (i, c, h, w)


def test_cifar_pickles_and_tarball(tmp_path):
    batches = _fake_cifar_batches(tmp_path / "c" / "cifar-10-batches-py")
    train_names = [f"data_batch_{i}" for i in range(1, 6)]
    dm = CIFAR10DataModule(root=str(tmp_path / "c"))
    dm.setup()
    assert dm.train_data.shape == (15, 3, 32, 32) and dm.val_data.shape == (3, 3, 32, 32)
    data, val, (i, c, h, w) = _expected_cifar(batches, train_names)
    assert torch.isclose(dm.train_data[i, c, h, w], val)
    assert torch.equal(dm.train_labels, torch.tensor(sum((batches[n]["labels"] for n in train_names), [])))
    assert torch.allclose(dm.train_data.reshape(15, -1), torch.as_tensor(data).float() / 127.5 - 1)
    # the official tarball, read in place
    tgz = tmp_path / "t" / "cifar-10-python.tar.gz"
    tgz.parent.mkdir()
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(tmp_path / "c" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    dm2 = CIFAR10DataModule(root=str(tmp_path / "t"))
    dm2.setup()
    assert torch.equal(dm2.train_data, dm.train_data) and torch.equal(dm2.val_labels, dm.val_labels)
    # class filter
    dm3 = CIFAR10DataModule(root=str(tmp_path / "c"), classes=[3])
    dm3.setup()
    assert bool((dm3.train_labels == 3).all()) and len(dm3.train_labels) == int((dm.train_labels == 3).sum())


def test_cifar_png_folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(3)
    imgs = {}
    for split in ("train", "test"):
        for cls in ("airplane", "cat"):
            d = tmp_path / "png" / split / cls
            d.mkdir(parents=True)
            for j in range(2):
                a = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(a).save(d / f"{j}.png")
                imgs[(split, cls, j)] = a
    dm = CIFAR10DataModule(root=str(tmp_path / "png"))
    dm.setup()
    assert dm.train_data.shape == (4, 3, 32, 32)
    assert dm.train_labels.tolist() == [0, 0, 1, 1]  # sorted class folders
    a = imgs[("train", "cat", 1)]
    assert torch.allclose(dm.train_data[3], torch.as_tensor(a).permute(2, 0, 1).float() / 127.5 - 1)


def test_cifar_missing_names_expected_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CIFAR10DataModule(root=str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    dm = CIFAR10DataModule(root=str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as e:
        dm.setup()
    msg = str(e.value)
    assert "data_batch_1" in msg and "test_batch" in msg and "cifar-10-python.tar.gz" in msg


# ---------------------------------------------------------------------------------------------
# GMM
# ---------------------------------------------------------------------------------------------
def test_gmm_datamodule_moments():
    w = [0.3, 0.7]
    means = [[2.0, -1.0], [-1.0, 0.5]]
    covs = [[[0.5, 0.2], [0.2, 0.3]], [[0.2, -0.05], [-0.05, 0.4]]]
    dm = GaussianMixtureDataModule(weights=w, means=means, covs=covs, n_train=20_000, n_val=500)
    dm.setup()
    W, M, C = (torch.tensor(v, dtype=torch.float64) for v in (w, means, covs))
    mu = (W[:, None] * M).sum(0)
    second = (W[:, None, None] * (C + M[:, :, None] * M[:, None, :])).sum(0)
    cov = second - torch.outer(mu, mu)
    x = dm.train_data.double()
    se = (cov.diag() / len(x)).sqrt()
    assert bool(((x.mean(0) - mu).abs() < 5 * se).all())
    assert torch.allclose(torch.cov(x.T), cov, atol=0.06)
    assert isinstance(dm.teacher, GaussianMixtureDenoiser) and dm.data_shape == (2,)
    # train and val come from disjoint seeds -> no shared rows
    assert torch.cdist(dm.val_data, dm.train_data).min() > 0
    assert dm.train_labels is None


def test_gmm_random_and_validation():
    dm = GaussianMixtureDataModule(n_components=3, dim=4, gmm_seed=1, n_train=50, n_val=10)
    dm.setup()
    assert dm.train_data.shape == (50, 4) and dm.teacher.num_components == 3
    with pytest.raises(ValueError, match="overlap"):
        GaussianMixtureDataModule(n_train=100, val_seed_offset=50)
    with pytest.raises(ValueError, match="weights, means, covs"):
        GaussianMixtureDataModule(weights=[1.0])


# ---------------------------------------------------------------------------------------------
# tensor files
# ---------------------------------------------------------------------------------------------
def test_tensorfile_npz_and_pt(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((20, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=20)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    dm = TensorFileDataModule(str(tmp_path / "d.npz"), val_fraction=0.25, value_range=None)
    dm.setup()
    assert dm.train_data.shape == (15, 3) and dm.val_data.shape == (5, 3)
    rows = {tuple(r) for r in x.tolist()}
    assert {tuple(r) for r in torch.cat([dm.train_data, dm.val_data]).tolist()} == rows
    # labels follow their rows
    lookup = {tuple(r): int(l) for r, l in zip(x.tolist(), y)}
    assert [lookup[tuple(r)] for r in dm.train_data.tolist()] == dm.train_labels.tolist()
    # .pt with explicit val, uint8 scaled
    xi = torch.randint(0, 256, (6, 1, 4, 4), dtype=torch.uint8)
    torch.save({"train": xi, "val": xi[:2]}, tmp_path / "d.pt")
    dm2 = TensorFileDataModule(str(tmp_path / "d.pt"))
    dm2.setup()
    assert torch.allclose(dm2.train_data, xi.float() / 127.5 - 1) and dm2.val_data.shape == (2, 1, 4, 4)


def test_tensorfile_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        TensorFileDataModule(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "a.npz", x=np.zeros((5, 2), np.float32), y=np.zeros(4, np.int64), val=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="train_labels"):
        TensorFileDataModule(str(tmp_path / "a.npz")).setup()
    np.savez(tmp_path / "b.npz", x=np.linspace(-1, 1, 10, dtype=np.float32).reshape(5, 2),
             val=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="val_data"):
        TensorFileDataModule(str(tmp_path / "b.npz")).setup()
    np.savez(tmp_path / "c.npz", z=np.zeros((5, 2)))
    with pytest.raises(ValueError, match="no training array"):
        TensorFileDataModule(str(tmp_path / "c.npz")).setup()


# ---------------------------------------------------------------------------------------------
# teacher distillation
# ---------------------------------------------------------------------------------------------
class CountingTeacher:
    """Wraps a denoiser and counts its calls (not an nn.Module on purpose: stays on CPU)."""

    def __init__(self, inner):
        self.inner, self.calls, self.shape = inner, 0, inner.shape
        self.sigma_range = inner.sigma_range

    def __call__(self, x, sigma):
        self.calls += 1
        return self.inner(x, sigma)

    def fingerprint(self):
        return self.inner.fingerprint()


def _small_gmm():
    return GaussianMixtureDenoiser(torch.tensor([0.4, 0.6]),
                                   torch.tensor([[1.0, 0.0, -1.0], [-1.0, 0.5, 0.0]]),
                                   torch.stack([0.2 * torch.eye(3), 0.1 * torch.eye(3) + 0.05]))


DISTILL_KW = dict(n_train=12, n_test=8, n_gen=100, num_steps=6, gen_batch_size=5, batch_size=4)


def test_distillation_equals_direct_endpoints():
    gmm = _small_gmm()
    dm = TeacherDistillationDataModule(teacher=CountingTeacher(gmm), **DISTILL_KW)
    dm.setup()
    sig = karras_sigmas(6)
    direct = sample_endpoints(gmm, torch.arange(0, 12), (3,), sigmas=sig, sampler="heun")
    direct_test = sample_endpoints(gmm, torch.arange(1_000_000, 1_000_008), (3,), sigmas=sig)
    assert torch.equal(dm.train_data64, direct) and torch.equal(dm.train_data, direct.float())
    assert torch.equal(dm.val_data, direct_test.float())
    assert torch.equal(dm.teacher_sigmas, sig) and dm.sampler == "heun" and dm.data_shape == (3,)
    assert dm.gen_seed_offset == 2_000_000 and torch.equal(dm.gen_seeds, torch.arange(2_000_000, 2_000_100))
    # the gen range is reserved, not generated: Heun-6 costs 11 calls per batch of 5 samples
    assert dm.teacher.calls == 11 * (3 + 2)


def test_distillation_cache_reuse_and_corruption_rebuild():
    t1 = CountingTeacher(_small_gmm())
    dm1 = TeacherDistillationDataModule(teacher=t1, **DISTILL_KW)
    dm1.prepare_data()
    dm1.setup()
    assert t1.calls > 0
    t2 = CountingTeacher(_small_gmm())
    dm2 = TeacherDistillationDataModule(teacher=t2, **DISTILL_KW)
    dm2.prepare_data()
    dm2.setup()
    assert t2.calls == 0  # everything from the cache
    assert torch.equal(dm2.train_data, dm1.train_data) and torch.equal(dm2.val_data, dm1.val_data)
    assert dm2.fingerprint() == dm1.fingerprint()
    # a different sampler grid is a different key
    t3 = CountingTeacher(_small_gmm())
    TeacherDistillationDataModule(teacher=t3, **{**DISTILL_KW, "num_steps": 5}).setup()
    assert t3.calls > 0
    # corrupt every endpoint cache file: detected and rebuilt with identical content
    files = sorted((cache_dir() / "endpoints").glob("*.pt"))
    assert len(files) == 4
    for f in files:
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        raw[len(raw) // 3] ^= 0xFF
        f.write_bytes(bytes(raw))
    t4 = CountingTeacher(_small_gmm())
    dm4 = TeacherDistillationDataModule(teacher=t4, **DISTILL_KW)
    dm4.setup()
    assert t4.calls == 11 * (3 + 2)
    assert torch.equal(dm4.train_data, dm1.train_data) and torch.equal(dm4.val_data, dm1.val_data)
    t5 = CountingTeacher(_small_gmm())
    TeacherDistillationDataModule(teacher=t5, **DISTILL_KW).setup()
    assert t5.calls == 0  # the rebuilt file is trusted again


@pytest.mark.parametrize("kw,match", [
    (dict(train_seed_offset=0, n_train=10, test_seed_offset=5), "overlap"),
    (dict(gen_seed_offset=1_000_004), "overlap"),
    (dict(train_seed_offset=-1), "train_seed_offset"),
    (dict(n_test=0), "n_test"),
    (dict(sampler="rk4"), "sampler"),
    (dict(num_steps=0), "num_steps"),
])
def test_distillation_bad_config_fails_before_work(kw, match):
    t = CountingTeacher(_small_gmm())
    with pytest.raises(ValueError, match=match):
        TeacherDistillationDataModule(teacher=t, **{**DISTILL_KW, **kw})
    assert t.calls == 0


def test_distillation_teacher_spec_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="teacher_ckpt"):
        TeacherDistillationDataModule(teacher_ckpt=str(tmp_path / "nope.ckpt"))
    with pytest.raises(ValueError, match="teacher"):
        TeacherDistillationDataModule(teacher="gmm_cifar")
    with pytest.raises(ValueError, match="teacher"):
        TeacherDistillationDataModule(teacher={"weights": [1.0]})
    with pytest.raises(ValueError, match="fingerprint"):
        TeacherDistillationDataModule(teacher=lambda x, s: x)
    with pytest.raises(ValueError, match="not both"):
        TeacherDistillationDataModule(teacher="gmm_digits", teacher_ckpt=__file__)


def test_distillation_dict_teacher_gaussian_matches_closed_form_flow():
    """Heun endpoints of a Gaussian teacher approach the exact flow map (eq. 32 of the PFD paper)."""
    cov = torch.tensor([[0.6, 0.2], [0.2, 0.3]], dtype=torch.float64)
    dm = TeacherDistillationDataModule(teacher={"mean": [0.5, -0.5], "cov": cov.tolist()},
                                       n_train=16, n_test=4, n_gen=4, num_steps=40)
    dm.setup()
    z = torch.stack([torch.as_tensor(s) for s in dm.train_seeds])
    from lightning_pfd.diffusion import seeded_noise

    x_T = 80.0 * seeded_noise(z, (2,))
    exact = dm.teacher.flow_map(x_T, 80.0, 0.0)
    assert torch.allclose(dm.train_data64, exact, atol=2e-2)


def test_distillation_gmm_digits_fit_is_deterministic_and_cached():
    dm = TeacherDistillationDataModule(n_components=2, n_train=4, n_test=4, n_gen=4, num_steps=3)
    dm.setup()
    assert dm.train_data.shape == (4, 64) and dm.teacher.num_components == 2
    assert dm.teacher.fingerprint().startswith("gmm-")
    from lightning_pfd.data.distill import fit_digits_gmm

    again = fit_digits_gmm(2, seed=0, use_cache=False)  # a fresh EM fit
    assert again.fingerprint() == dm.teacher.fingerprint()
    img = fit_digits_gmm(2, as_image=True)
    assert img.shape == (1, 8, 8) and torch.equal(img.means, again.means)


def test_distillation_checkpoint_teacher(tmp_path):
    from lightning_pfd.modules import DiffusionModule
    from lightning_pfd.nets import MLPNet

    torch.manual_seed(0)
    module = DiffusionModule(MLPNet(dim=3, hidden=16, depth=1, emb_dim=8))
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(module, GaussianMixtureDataModule(dim=3, n_train=8, n_val=4, batch_size=8))
    ckpt = tmp_path / "teacher.ckpt"
    trainer.save_checkpoint(ckpt)
    kw = dict(teacher_ckpt=str(ckpt), n_train=4, n_test=2, n_gen=2, num_steps=3)
    if "net" not in torch.load(ckpt, weights_only=True)["hyper_parameters"]:
        with pytest.raises(RuntimeError, match="teacher_load_kwargs"):
            TeacherDistillationDataModule(**kw).setup()
        kw["teacher_load_kwargs"] = {"net": MLPNet(dim=3, hidden=16, depth=1, emb_dim=8)}
    dm = TeacherDistillationDataModule(**kw)
    dm.setup()
    assert dm.data_shape == (3,)
    assert dm.teacher.fingerprint() == "ckpt-" + hashlib.sha256(ckpt.read_bytes()).hexdigest()
    direct = sample_endpoints(module.denoiser.to("cpu"), torch.arange(4), (3,), sigmas=dm.teacher_sigmas)
    assert torch.allclose(dm.train_data64, direct, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# loaders inside a Trainer
# ---------------------------------------------------------------------------------------------
class TinyModule(pl.LightningModule):
    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((tuple(x.shape), y.clone()))
        return F.mse_loss(self.lin(x.flatten(1)), torch.zeros(len(x), 1))

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val/loss", self.lin(x.flatten(1)).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("make,dim,labelled", [
    (lambda: DigitsDataModule(as_vector=True, n_train=64, samples_per_epoch=32, batch_size=16), 64, True),
    (lambda: GaussianMixtureDataModule(dim=3, n_train=64, n_val=16, batch_size=16), 3, False),
])
def test_trainer_fast_dev_run(make, dim, labelled):
    dm, model = make(), TinyModule(dim)
    trainer = pl.Trainer(fast_dev_run=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, dm)
    assert len(model.seen) == 2
    for shape, y in model.seen:
        assert shape == (16, dim) and y.dtype == torch.long
        assert bool(((y >= 0) & (y < 10)).all()) if labelled else bool((y == -1).all())


def test_state_dict_fingerprint_warns_on_other_training_set():
    a, b = _arange_dm(n_train=10, subset_seed=1), _arange_dm(n_train=10, subset_seed=2)
    a.setup(), b.setup()
    state = a.state_dict()
    assert state == {"fingerprint": a.fingerprint()}
    with pytest.warns(UserWarning, match="different training set"):
        b.load_state_dict(state)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.load_state_dict(state)


def test_replacement_sampler_survives_lightning_ddp_wrapping():
    """Lightning wraps (not replaces) our sampler under DDP: epoch length and seeding survive."""
    from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler

    dm = _arange_dm(n=16, samples_per_epoch=40, batch_size=8)
    dm.setup()
    loader = dm.train_dataloader()
    shards = [list(_get_distributed_sampler(loader, shuffle=True, overfit_batches=0,
                                            num_replicas=2, rank=r)) for r in range(2)]
    assert [len(s) for s in shards] == [20, 20]
    # the two ranks together see exactly the 40 seeded draws of this epoch, in some order
    drawn = list(SeededReplacementSampler(16, 40, seed=0))
    wrapped = _get_distributed_sampler(loader, shuffle=True, overfit_batches=0, num_replicas=2, rank=0)
    wrapped.set_epoch(3)
    assert loader.sampler.epoch == 3  # set_epoch reaches our sampler
    assert sorted(shards[0] + shards[1]) == sorted(drawn)
