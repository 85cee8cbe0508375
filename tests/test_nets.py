"""Tests of lightning_pfd.nets: U-Net presets (PFD paper Table 2), shapes, conditioning, taps."""
import copy
import math

import pytest
import torch

from lightning_pfd.diffusion import EDMFamily, VPFamily
from lightning_pfd.nets import MLPNet, UNET_PRESET_PARAMS, UNET_PRESETS, UNet, count_parameters
from lightning_pfd.nets.layers import FourierEmbedding, PositionalEmbedding

TINY = dict(model_channels=16, channel_mult=(1, 2), num_blocks=1, dropout=0.0)


def _randomize(net: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Replace the (almost-zero) EDM output initialisation so outputs are O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            is_norm_gain = "norm" in name and name.endswith("weight")
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if is_norm_gain else 0.0))
    return net


class _CallCounter:
    """Counts forward calls of every submodule (to show forward_features stops early)."""

    def __init__(self, net):
        self.calls = 0
        self.handles = [m.register_forward_hook(self._hook) for m in net.modules() if m is not net]

    def _hook(self, *_):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


def _hooked(net, tap, x, c):
    out = {}
    h = net.feature_taps[tap].register_forward_hook(lambda m, i, o: out.__setitem__("v", o))
    y = net(x, c)
    h.remove()
    return out["v"], y


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("preset", list(UNET_PRESETS))
def test_preset_param_counts_match_table2(preset):
    with torch.device("meta"):
        net = UNet(preset, img_resolution=32, in_channels=3)
    n, ref = count_parameters(net), UNET_PRESET_PARAMS[preset]
    assert abs(n - ref) / ref < 0.03, (preset, n, ref)


def test_table2_reference_values_and_exact_edm_count():
    # Independent oracle: EDM's CIFAR-10 ddpm++ has 55.73M params, unet1 0.881M (PFD paper Table 2).
    with torch.device("meta"):
        assert round(count_parameters(UNet("unet10")) / 1e4) == 5573
        assert round(count_parameters(UNet("unet1")) / 1e3) == 881
    assert UNET_PRESET_PARAMS["unet10"] == 55.73e6


def test_meta_count_equals_real_count():
    real = UNet("unet1", dropout=0.0)
    with torch.device("meta"):
        meta = UNet("unet1", dropout=0.0)
    manual = sum(p.numel() for p in real.parameters())
    assert count_parameters(real) == count_parameters(meta) == manual
    assert count_parameters(real, trainable_only=True) == manual
    real.map_layer0.weight.requires_grad_(False)
    assert count_parameters(real, trainable_only=True) == manual - real.map_layer0.weight.numel()


def test_preset_widths_and_override():
    net = UNet("unet6", img_resolution=16, in_channels=1, num_blocks=1, model_channels=8)
    assert (net.model_channels, net.channel_mult, net.num_blocks) == (8, (2, 2, 2), 1)
    with torch.device("meta"):
        u5 = UNet("unet5")
    widths = [u5.enc[f"{r}x{r}_block0"].out_channels for r in (32, 16, 8)]
    assert widths == [80, 160, 160]
    assert UNet("unet2", img_resolution=8, num_blocks=1).attn_resolutions == (4,)


def test_unknown_preset_lists_names():
    with pytest.raises(ValueError, match=r"preset.*unet1.*unet10"):
        UNet("unet11")


@pytest.mark.parametrize("kw, field", [
    (dict(img_resolution=30, channel_mult=(1, 2, 2)), "img_resolution"),   # 30 % 4 != 0
    (dict(img_resolution=12, channel_mult=(1, 2, 2, 2)), "img_resolution"),
    (dict(img_resolution=0), "img_resolution"),
    (dict(attn_resolutions=(16,), img_resolution=28), "attn_resolutions"),  # levels 28, 14
    (dict(num_blocks=0), "num_blocks"),
    (dict(channel_mult=()), "channel_mult"),
    (dict(dropout=1.5), "dropout"),
    (dict(embedding_type="sinus"), "embedding_type"),
])
def test_bad_config_raises(kw, field):
    args = {**TINY, **kw}
    with pytest.raises(ValueError, match=field):
        UNet(**args)


def test_bad_input_shape_raises():
    net = UNet(img_resolution=16, in_channels=1, **TINY)
    with pytest.raises(ValueError, match="x_in"):
        net(torch.zeros(2, 3, 16, 16), torch.zeros(2))
    with pytest.raises(ValueError, match="c_noise"):
        net(torch.zeros(2, 1, 16, 16), torch.zeros(3))
    with pytest.raises(ValueError, match="tap"):
        net.forward_features(torch.zeros(2, 1, 16, 16), torch.zeros(2), "dec.nope")


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("res", [8, 16, 28, 32])
@pytest.mark.parametrize("channels", [1, 3])
def test_output_shape_equals_input_shape(res, channels):
    net = UNet(img_resolution=res, in_channels=channels, **TINY)
    assert net.data_shape == (channels, res, res)
    x = torch.randn(2, channels, res, res)
    y = net(x, torch.tensor([0.1, -0.3]))
    assert y.shape == x.shape and y.dtype == torch.float32 and torch.isfinite(y).all()


def test_three_levels_at_28_native():
    net = UNet(img_resolution=28, in_channels=1, model_channels=8, channel_mult=(1, 1, 1),
               num_blocks=1, dropout=0.0)
    assert [k for k in net.enc if k.endswith("down")] == ["14x14_down", "7x7_down"]
    assert net.default_tap == "dec.14x14_block1" and net.attn_resolutions == (14,)
    x = torch.randn(2, 1, 28, 28)
    assert net(x, torch.zeros(2)).shape == x.shape


def test_out_channels():
    net = UNet(img_resolution=8, in_channels=3, out_channels=6, **TINY)
    assert net(torch.randn(2, 3, 8, 8), torch.zeros(2)).shape == (2, 6, 8, 8)


def test_noise_conditioning_changes_output_per_sample():
    torch.manual_seed(0)
    net = _randomize(UNet(img_resolution=8, in_channels=1, **TINY)).eval()
    x = torch.randn(1, 1, 8, 8).expand(2, 1, 8, 8)
    c = torch.tensor([-1.0, 1.0])
    y = net(x, c)
    rel = (y[0] - y[1]).norm() / y[0].norm()
    assert rel > 1e-2, rel                                        # conditioning is used
    # per-sample conditioning: batched output equals one-by-one output (no cross-talk)
    y1 = net(x[:1], c[1:])
    assert torch.allclose(y[1:], y1, atol=1e-5, rtol=1e-4)
    assert torch.equal(net(x, torch.tensor(0.5)), net(x, torch.tensor([0.5, 0.5])))


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    net = UNet(img_resolution=8, in_channels=3, **TINY).train()
    x = torch.randn(3, 3, 8, 8)
    loss = EDMFamily().precondition(net)(x, torch.tensor([0.1, 1.0, 10.0])).square().sum()
    loss.backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_works_inside_edm_and_vp_preconditioning():
    net = UNet(img_resolution=8, in_channels=1, **TINY)
    x = torch.randn(2, 1, 8, 8)
    for precond in (EDMFamily().precondition(net), VPFamily().precondition(net)):          # VP: c_noise up to 999
        d = precond(x, torch.tensor([0.01, 80.0]))
        assert d.shape == x.shape and torch.isfinite(d).all()


# ----------------------------------------------------------------------------- feature taps
def test_taps_names_and_default_tap_shape():
    net = UNet(img_resolution=32, in_channels=3, model_channels=8, channel_mult=(2, 2, 2),
               num_blocks=2, dropout=0.0)
    for name in ("enc.32x32_conv", "enc.32x32_block0", "enc.16x16_down", "enc.8x8_block1",
                 "dec.8x8_in0", "dec.8x8_in1", "dec.16x16_up", "dec.16x16_block2",
                 "dec.32x32_aux_conv"):
        assert name in net.feature_taps, name
    assert net.default_tap == "dec.16x16_block1"
    assert net.feature_taps["dec.16x16_block1"] is net.dec["16x16_block1"]
    feats, _ = _hooked(net, net.default_tap, torch.randn(2, 3, 32, 32), torch.zeros(2))
    assert feats.shape == (2, 16, 16, 16)
    # decoder at the 16x16 level has num_blocks + 1 = 3 blocks, encoder num_blocks = 2
    assert sum(k.startswith("dec.16x16_block") for k in net.feature_taps) == 3
    assert sum(k.startswith("enc.16x16_block") for k in net.feature_taps) == 2


@pytest.mark.parametrize("tap", ["enc.16x16_block0", "dec.16x16_in0", "dec.16x16_block1",
                                 "dec.32x32_block0", "dec.32x32_aux_conv"])
def test_forward_features_equals_hook_and_stops_early(tap):
    torch.manual_seed(1)
    net = _randomize(UNet(img_resolution=32, in_channels=3, **TINY)).eval()
    x, c = torch.randn(2, 3, 32, 32), torch.tensor([0.2, -0.7])
    counter = _CallCounter(net)
    hooked, _ = _hooked(net, tap, x, c)
    full_calls, counter.calls = counter.calls, 0
    feats = net.forward_features(x, c, tap)
    part_calls = counter.calls
    counter.remove()
    assert torch.equal(feats, hooked)
    if tap == "dec.32x32_aux_conv":
        assert part_calls == full_calls
    else:
        assert part_calls < full_calls, (part_calls, full_calls)


def test_forward_features_default_tap_is_much_cheaper():
    net = UNet("unet1", img_resolution=16, in_channels=1, dropout=0.0).eval()
    counter = _CallCounter(net)
    net(torch.randn(1, 1, 16, 16), torch.zeros(1))
    full, counter.calls = counter.calls, 0
    net.forward_features(torch.randn(1, 1, 16, 16), torch.zeros(1))
    assert counter.calls < 0.75 * full, (counter.calls, full)


def test_deepcopy_taps_point_to_copy():
    # EMA copies the net; hooks must land on the copy's modules.
    net = UNet(img_resolution=8, in_channels=1, **TINY)
    ema = copy.deepcopy(net)
    assert ema.feature_taps[ema.default_tap] is ema.dec["4x4_block1"]
    assert ema.feature_taps[ema.default_tap] is not net.feature_taps[net.default_tap]


# ----------------------------------------------------------------------------- embeddings
def test_positional_embedding_closed_form():
    emb = PositionalEmbedding(8)
    c = torch.tensor([0.0, 0.3, -2.0])
    f = torch.tensor([10000.0 ** (-j / 3) for j in range(4)])
    ref = torch.cat([torch.cos(c[:, None] * f), torch.sin(c[:, None] * f)], 1)
    assert torch.allclose(emb(c), ref, atol=1e-6)


def test_fourier_embedding_is_deterministic_and_bounded():
    a, b = FourierEmbedding(16), FourierEmbedding(16)
    c = torch.linspace(-3, 3, 7)
    assert torch.equal(a(c), b(c))
    e = a(c)
    assert torch.allclose(e[:, :8] ** 2 + e[:, 8:] ** 2, torch.ones(7, 8), atol=1e-5)
    net = UNet(img_resolution=8, in_channels=1, embedding_type="fourier", adaptive_scale=True, **TINY)
    assert net(torch.randn(2, 1, 8, 8), torch.zeros(2)).shape == (2, 1, 8, 8)
    assert net.dec["4x4_block1"].affine.out_features == 2 * 32          # scale and shift


# ----------------------------------------------------------------------------- MLPNet
def test_mlp_shapes_taps_and_conditioning():
    torch.manual_seed(0)
    net = _randomize(MLPNet(5, hidden=32, depth=4, emb_dim=16)).eval()
    assert net.data_shape == (5,)
    assert net.default_tap == "middle_hidden"
    assert net.feature_taps["middle"] is net.blocks[1]
    assert net.feature_taps["middle_hidden"] is net.blocks[1].act
    assert {"in", "block0", "block3", "block0_hidden", "block3_hidden", "out"} <= set(net.feature_taps)
    x = torch.randn(1, 5).expand(2, 5)
    y = net(x, torch.tensor([-1.0, 1.0]))
    assert y.shape == (2, 5)
    assert (y[0] - y[1]).norm() / y[0].norm() > 1e-2
    assert torch.allclose(y[1:], net(x[:1], torch.tensor([1.0])), atol=1e-6)
    feats, _ = _hooked(net, "middle", x, torch.zeros(2))
    assert feats.shape == (2, 32)


@pytest.mark.parametrize("tap", ["in", "block0", "middle", "block3", "block0_hidden",
                                 "middle_hidden", "block3_hidden", "out"])
def test_mlp_forward_features_equals_hook(tap):
    torch.manual_seed(0)
    net = _randomize(MLPNet(3, hidden=16, depth=4, emb_dim=8)).eval()
    x, c = torch.randn(4, 3), torch.randn(4)
    counter = _CallCounter(net)
    hooked, _ = _hooked(net, tap, x, c)
    full, counter.calls = counter.calls, 0
    feats = net.forward_features(x, c, tap)
    counter.remove()
    assert torch.equal(feats, hooked)
    assert (counter.calls < full) == (tap != "out")


def _linear_r2(x: torch.Tensor, h: torch.Tensor) -> float:
    """Fraction of the variance of h explained by a least-squares affine map of x (float64)."""
    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    res = h - x1 @ torch.linalg.lstsq(x1, h).solution
    return float(1 - res.square().sum() / (h - h.mean(0)).square().sum())


@pytest.mark.parametrize("dim,hidden,depth", [(2, 64, 4), (8, 64, 4), (3, 32, 1)])
def test_mlp_default_tap_is_not_a_linear_function_of_the_input(dim, hidden, depth):
    """At initialisation the residual stream ("middle", the former default) *is* the linear
    input projection (the branches' last layers start at 1e-5 scale): R^2 > 0.9999. The default
    tap, the middle block's hidden activation, is not: R^2 ~ 0.7 (the linear part of SiLU on
    unit-variance pre-activations; measured 0.66-0.72 over these shapes and seeds)."""
    for seed in range(2):
        torch.manual_seed(seed)
        net = MLPNet(dim, hidden=hidden, depth=depth, emb_dim=16).eval()
        x = torch.randn(2000, dim, generator=torch.Generator().manual_seed(100 + seed))
        c = torch.full((2000,), -0.3)
        with torch.no_grad():
            default = net.forward_features(x, c).double()
            middle = net.forward_features(x, c, "middle").double()
        assert default.shape == middle.shape == (2000, hidden)
        assert _linear_r2(x.double(), default) < 0.8
        assert _linear_r2(x.double(), middle) > 0.9999
        assert float(default.var(0).sum()) > 0.01 * float(middle.var(0).sum())  # not a dead tap


def test_mlp_gradients_and_bad_input():
    net = MLPNet(2, hidden=16, depth=2, emb_dim=8, dropout=0.1).train()
    VPFamily().precondition(net)(torch.randn(8, 2), torch.rand(8) * 10 + 0.01).square().sum().backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    with pytest.raises(ValueError, match="x_in"):
        net(torch.zeros(3, 4), torch.zeros(3))
    for kw, field in ((dict(dim=0), "dim"), (dict(dim=2, depth=0), "depth"),
                      (dict(dim=2, emb_dim=7), "emb_dim"), (dict(dim=2, dropout=-0.1), "dropout")):
        with pytest.raises(ValueError, match=field):
            MLPNet(**kw)
    with pytest.raises(ValueError, match="tap"):
        net.forward_features(torch.zeros(3, 2), torch.zeros(3), "block9")
    assert math.isclose(count_parameters(net), sum(p.numel() for p in net.parameters()))
