"""Issue 42 item 1, the benchmarks' part: numbers that README.md and docs/ quote from the benchmark
records (``benchmarks/results.json``, ``results_gpu.json``, ``threads_result.json``,
``pfd_empirical_result.json``), from ``experiments/results/levy_exact_score.json`` (written by
``experiments/levy_exact_score.py``: the exact-score sampler check and the truncation figures of
docs/levy.md) and the record-backed timings of docs/levy.md and docs/sweeps_analysis.md, each
checked against its record with the page's rounding, in the style of
``tests/test_quoted_numbers_audit.py`` (whose helpers are reused): a check builds the quoted text
from the record and looks for it in the page (HTML comments removed, whitespace folded). Figures
that no record holds are marked on the pages as not recorded (with the commit they were measured
for) and are not checked here. A few FLOP counts of docs/performance.md that the budget record does
not keep (the forward to the ICR tap of the two CIFAR-10 U-Nets) are recounted from the configs, as
the audit recounts model sizes."""
from __future__ import annotations

import functools
import json
import math
import re
import statistics
from pathlib import Path

from test_quoted_numbers_audit import _cells, _close, _doc_table, _missing, _page, _rec, _sci

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@functools.lru_cache(maxsize=None)
def _bench(name: str = "results.json") -> dict:
    return json.loads((BENCH / name).read_text())


def _row(section: str, measured: str, floor: str = "") -> dict:
    """The row of a ``benchmarks/results.json`` section whose "measured" (and "floor") start so."""
    rows = [r for r in _bench()[section]["rows"] if r["measured"].startswith(measured) and r["floor"].startswith(floor)]
    assert len(rows) == 1, (section, measured, floor, len(rows))
    return rows[0]


def test_the_benchmark_checks_can_fail():
    """A phrase built from a changed record value is not found."""
    r = _row("monitors", "MemorizationMonitor")["ratio_cpu"]
    assert _missing("docs/performance.md", [f"| generate + exact 2-NN | {r:.2f} | met |"]) == []
    assert _missing("docs/performance.md", [f"| generate + exact 2-NN | {r + 0.01:.2f} | met |"]) != []


# ----------------------------------------------------------------------------- docs/performance.md: CPU sections
def test_the_performance_summary_is_the_record():
    b = _bench()
    commit = b["monitors"]["meta"]["commit"]
    same = [s for s in b if b[s]["meta"]["commit"] == commit]
    assert set(same) == {"empirical", "monitors", "training", "quickstart", "budget"}
    assert {f"{b[s]['meta']['load_average'][0]:.0f}" for s in same} == {"1"}
    minutes = sum(b[s]["meta"]["section_seconds"] for s in same) / 60
    g, gl, cold = _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 student"), \
        _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 + 2"), _row("monitors", "GeneralizationMonitor, first epoch")
    icr, meas = _row("monitors", "ICRMonitor"), _row("monitors", "of which: RepresentationEvaluation")
    unet, mem, tail = _row("monitors", "ICR measurement on icr_unet_large"), _row("monitors", "MemorizationMonitor"), \
        _row("monitors", "TailMonitor (plot=False)")
    small, minimal, big = (_row("training", f"training step, Lightning {m}") for m in (
        "DiffusionModule, MLPNet(256", "minimal", "DiffusionModule, MLPNet(1024"))
    emp = b["empirical"]["raw"]
    mixed = [_row("empirical", f"EmpiricalDenoiser mixed ({d} data)", "float32")["ratio"] for d in ("smooth", "iid")]
    speed = sorted(emp[d]["speedup_vs_float64"] for d in ("smooth", "iid"))
    dense = sorted(round(35 * emp[d]["calls_mostly_dense"]) for d in ("smooth", "iid"))
    memrow = b["memory"]["rows"][0]
    assert {f"{x:.2f}" for x in mixed} == {"1.22"} and not small["meets_goal"] and big["meets_goal"] and not icr["meets_goal"]
    assert all(r["meets_goal"] for r in (g, cold, unet, mem, tail)) and memrow["within_bound"]
    assert _missing("docs/performance.md", [
        f"Recorded at commit `{commit}` on a quiet machine (load average ≈ 1",
        f"(`python benchmarks/run.py`, ≈ {minutes:.0f} min on 2 CPU cores)",
        f"| M × 35 student forwards | {g['ratio_cpu']:.2f} ({gl['ratio_cpu']:.2f} with its 2 × 512 loss forwards) | ≤ 1.2 met |",
        f"| student + teacher + empirical flows + loss forwards | {cold['ratio_cpu']:.2f} | ≤ 1.2 met |",
        f"| 2n forwards to the tap | {icr['ratio_cpu']:.2f} (the measurement alone {meas['ratio_cpu']:.2f}) | **missed**: "
        f"Lightning's logging of 6 keys, {1000 * (icr['cpu_seconds'] - meas['cpu_seconds']):.0f} ms per epoch |",
        f"| 2n forwards to the tap | {unet['ratio_cpu']:.2f} | met |",
        f"| generate + exact 2-NN | {mem['ratio_cpu']:.2f} | met |",
        f"| generate + one LOADER | {tail['ratio_cpu']:.2f} | met |",
        f"| plain PyTorch loop (fused Adam, EMA) | speed {big['speed_vs_plain_cpu']:.2f} | ≥ 0.95 met |",
        f"| speed {small['speed_vs_plain_cpu']:.2f} (= a minimal LightningModule's {minimal['speed_vs_plain_cpu']:.2f}) | "
        f"**missed**: Lightning's own loop, ~{small['overhead_ms_per_step_cpu']:.1f} ms per "
        f"{1000 * small['floor_cpu_seconds']:.1f}-ms step |",
        f"| {mixed[0]:.2f} ({speed[0]:.2f}–{speed[1]:.2f}× the float64 denoiser's speed) | ≤ 1.11 **missed**: "
        f"{dense[0]}–{dense[1]} of 35 Heun calls are dense |",
        f"| empirical reference, M = N = {b['memory']['config']['M']}, D = {b['memory']['config']['D']} | stated bound "
        f"{memrow['bound_mb']:.0f} MB | peak RSS {memrow['peak_mb']:.0f} MB | met |",
    ]) == []
    assert "8.8" in f"{big['measured']}" and b["memory"]["config"]["N"] == b["memory"]["config"]["M"]


def _quickstart_fraction():
    """Training 8 ms CPU per step, 250 steps per epoch; the three monitors' CPU seconds per epoch;
    measuring every epoch vs on the log schedule (10 of 24 epochs)."""
    from lightning_pfd.callbacks.schedule import log_schedule

    cfg = _bench()["monitors"]["config"]["data"]
    steps = cfg["samples_per_epoch"] // cfg["batch_size"]
    step = _row("training", "training step, Lightning DiffusionModule, MLPNet(256")["cpu_seconds"]
    parts = [_row("monitors", m, f)["cpu_seconds"] for m, f in (("GeneralizationMonitor, per epoch", "M x 35 student"),
                                                                ("ICRMonitor", ""), ("MemorizationMonitor", ""))]
    sched = log_schedule(24)
    mon, train = sum(parts), steps * step
    return steps, step, parts, sched, mon / (mon + train), len(sched) * mon / (len(sched) * mon + 24 * train)


def test_the_performance_monitor_table_and_its_notes_are_the_record():
    cfg = _bench()["monitors"]["config"]
    g, gl = _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 student"), _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 + 2")
    cold, ref = _row("monitors", "GeneralizationMonitor, first epoch"), _row("monitors", "of which: references computed")
    load = _row("monitors", "GeneralizationMonitor, references loaded")
    icr, meas = _row("monitors", "ICRMonitor"), _row("monitors", "of which: RepresentationEvaluation")
    unet, mem = _row("monitors", "ICR measurement on icr_unet_large"), _row("monitors", "MemorizationMonitor")
    tail, plot = _row("monitors", "TailMonitor (plot=False)"), _row("monitors", "TailMonitor (plot=True")
    rows = _bench()["monitors"]["rows"]
    assert max(abs(r["ratio"] - r["ratio_cpu"]) for r in rows) <= 0.01  # "wall and CPU ratios agree to 0.01"
    steps, step, parts, sched, every, log = _quickstart_fraction()
    assert _missing("docs/performance.md", [
        f"| M × 35 student forwards | {g['cpu_seconds']:.2f} s | **{g['ratio_cpu']:.2f}** ({gl['ratio_cpu']:.2f} with its "
        "2 × 512 loss forwards in the floor) |",
        f"| {cold['cpu_seconds']:.2f} s | **{cold['ratio_cpu']:.2f}** (references: {ref['cpu_seconds']:.2f} s, "
        f"{ref['ratio_cpu']:.2f} of that floor) |",
        f"| `ICRMonitor`, {cfg['icr']['num_images'] * cfg['icr']['views_per_image']} view pairs | 2n forwards to the tap | "
        f"{1000 * icr['cpu_seconds']:.0f} ms | **{icr['ratio_cpu']:.2f}** (the measurement alone {meas['ratio_cpu']:.2f}) |",
        f"| 2n forwards to the tap | {unet['cpu_seconds']:.2f} s | **{unet['ratio_cpu']:.2f}** |",
        f"| `MemorizationMonitor`, {cfg['memorization']['num_samples']} samples | `generate` + exact 2-NN | "
        f"{mem['cpu_seconds']:.3f} s | **{mem['ratio_cpu']:.2f}** |",
        f"| `TailMonitor`, {cfg['tail']['num_samples']} samples, `plot=False` | `generate` + one LOADER | "
        f"{tail['cpu_seconds']:.2f} s | **{tail['ratio_cpu']:.2f}** |",
        f"best of {cfg['rounds']} interleaved rounds, {g['rounds']} of them with a cold cache",
        f"tiny MLP** ({icr['ratio_cpu']:.2f};",
        f"two forwards of 256 rows to the tap ({1000 * icr['floor_cpu_seconds']:.1f} ms)",
        f"the measurement itself is at **{meas['ratio_cpu']:.2f}**",
        f"The rest, ~{1000 * (icr['cpu_seconds'] - meas['cpu_seconds']):.0f} ms per epoch",
        f"the same measurement is at **{unet['ratio_cpu']:.2f}**",
        f"(`plot=True`, {plot['ratio_cpu']:.2f}×; paired median {plot['ratio_paired_median']:.2f})",
        f"keep `plot=False` at {tail['ratio_cpu']:.2f}× the floor of `generate` + one LOADER",
        f"once per cache key ({ref['cpu_seconds']:.2f} s CPU, {ref['ratio_cpu']:.2f} of the cold floor); later runs load them "
        f"in {1000 * load['cpu_seconds']:.0f} ms ({load['ratio_cpu']:.2f} × the student's floor)",
        f"a training step takes {1000 * step:.1f} ms CPU ({steps} steps: {steps * step:.1f} s per epoch), the three monitors "
        f"{sum(parts):.2f} s CPU per epoch ({parts[0]:.2f} + {parts[1]:.3f} + {parts[2]:.3f}), so measuring every epoch "
        f"takes **{100 * every:.0f} %**",
        f"({len(sched)} of the 24 epochs: {', '.join(map(str, sched))}) **{100 * log:.0f} %**",
        f"Measuring every epoch costs {100 * every:.0f} % of the quickstart ({100 * log:.0f} % with `schedule: log`)",
    ]) == []
    assert (cfg["generalization"]["num_eval"], cfg["data"]["n_train"], cfg["net"]["hidden"]) == (256, 64, 256)


def test_the_performance_quickstart_and_training_sections_are_the_record():
    q = _bench()["quickstart"]
    cold, warm = (r for r in q["rows"])
    assert cold["measured"].endswith("cold cache") and warm["measured"].endswith("warm cache")
    small, minimal, big = (_row("training", f"training step, Lightning {m}") for m in (
        "DiffusionModule, MLPNet(256", "minimal", "DiffusionModule, MLPNet(1024"))
    params = float(re.search(r"([\d.]+)M params", big["measured"]).group(1))
    assert _missing("docs/performance.md", [
        f"(`quickstart` section: {q['config']['epochs']} epochs, W&B offline",
        f"{warm['seconds']:.1f} s with a warm cache against {warm['floor_seconds']:.1f} s without callbacks "
        f"({100 * warm['measuring_fraction']:.0f} % of the run",
        f"{cold['seconds']:.1f} s with a cold cache (the teacher data and references computed once: "
        f"{100 * cold['measuring_fraction']:.0f} %)",
        f"(section 1: {q['config']['epochs']} of its 24 epochs in {warm['seconds']:.1f} s with a warm cache and "
        f"{cold['seconds']:.1f} s with a cold one, 1 thread, a quiet machine)",
        f"| MLPNet 256 × 4, 0.64 M parameters (quickstart) | {1000 * small['floor_cpu_seconds']:.1f} ms | "
        f"**{small['speed_vs_plain_cpu']:.2f}×** the plain loop's speed ({small['overhead_ms_per_step_cpu']:.2f} ms/step "
        f"over it) | {minimal['speed_vs_plain_cpu']:.2f}× ({minimal['overhead_ms_per_step_cpu']:.2f} ms/step) |",
        f"| MLPNet 1024 × 4, {params:.1f} M parameters | {1000 * big['floor_cpu_seconds']:.0f} ms | "
        f"**{big['speed_vs_plain_cpu']:.2f}×** (goal ≥ 0.95 met) |",
        f"(the table: {small['overhead_ms_per_step_cpu']:.2f} ms/step over the plain loop against the minimal "
        f"LightningModule's {minimal['overhead_ms_per_step_cpu']:.2f})",
        f"Against a {1000 * small['floor_cpu_seconds']:.1f} ms plain step",
    ]) == []
    assert q["config"]["threads"] == 1 and _bench()["training"]["config"]["batch"] == 64


# ----------------------------------------------------------------------------- docs/performance.md: the budget
def _budget(name: str) -> dict:
    return _row("budget", f"{name}: measuring")["detail"]


def _tap_gflop(net_args: dict, shape) -> float:
    """The forward to the default ICR tap per sample (FlopCounterMode, 2 FLOP per multiply-add),
    as benchmarks/run.py's _net_flops counts it."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_pfd.diffusion import EDMFamily
    from lightning_pfd.diffusion.features import tap_features
    from lightning_pfd.nets import UNet

    den = EDMFamily().precondition(UNet(**net_args)).eval()
    x = torch.randn(2, *shape)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        tap_features(den.net, *den.network_input(x, 0.29), None)
    return fc.get_total_flops() / 2 / 1e9


def test_the_budget_tables_and_prose_are_the_record():
    import yaml

    from lightning_pfd.callbacks.schedule import log_schedule

    cfg = _bench()["budget"]["config"]
    gpu, nfe = cfg["gpu"], cfg["nfe"]
    rate = gpu["bf16"] * gpu["utilization"]  # TFLOP/s achieved
    d, e, u = _budget("distill_vp_cifar10"), _budget("edm_cifar10"), _budget("icr_unet_large")
    fwd, train, epochs = d["forward_gflop"] * 1e-6, d["train_pflop_per_epoch"], d["epochs"]  # PFLOP
    meas = d["measure_pflop"]["generalization"]
    loss = meas - 1024 * nfe * fwd  # the 2 x num_loss_samples loss forwards of the shipped M = 1024

    def frac(n_measured, measure, val):
        cost = n_measured * measure + epochs * val
        return cost / (cost + epochs * train)

    m4 = 1e4 * nfe * fwd + loss  # the paper's M = 10^4
    full, lim = 1e4 * fwd, 1024 * fwd  # validation: all 10^4 held-out samples, or 1024
    every4, log4, lim4 = frac(epochs, m4, full), frac(d["log_passes"], m4, full), frac(d["log_passes"], m4, lim)
    hours4 = every4 / (1 - every4) * d["gpu_hours_training"]
    budget = 0.25 * epochs * train - epochs * lim
    with_final = lambda m: (d["log_passes"] * m + m4 + epochs * lim) / (d["log_passes"] * m + m4 + epochs * lim + epochs * train)  # noqa: E731
    m768 = (768 * nfe + 2 * 1024) * fwd
    steps = round(train * 1e6 / (d["train_gflop_per_sample"] * 128))
    y = yaml.safe_load((ROOT / "lightning_pfd/configs/distill_vp_cifar10.yaml").read_text())
    tap4 = _tap_gflop(dict(y["model"]["init_args"]["net"]["init_args"]), (3, 32, 32))
    tap10 = _tap_gflop(dict(preset="unet10", img_resolution=32, in_channels=3), (3, 32, 32))
    tap_icr = u["measure_pflop"]["icr"] * 1e6 / (2 * 1024)  # recorded: 2 x 1024 pairs to the tap
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    teacher4 = d["once_pflop"]["teacher_flow"] * 1e4 / 1024
    emp4 = d["once_pflop"]["empirical_flow"] * 1e4 / 1024 * 1e15
    assert _missing("docs/performance.md", [
        f"| `unet4`, 3 × 32 × 32 (distillation student) | {d['params'] / 1e6:.1f} M | {d['forward_gflop']:.1f} GFLOP | "
        f"{d['train_gflop_per_sample']:.1f} GFLOP | {tap4:.1f} GFLOP |",
        f"| `unet10`, 3 × 32 × 32 (EDM teacher) | {e['params'] / 1e6:.1f} M | {e['forward_gflop']:.1f} GFLOP | "
        f"{e['train_gflop_per_sample']:.1f} GFLOP | {tap10:.1f} GFLOP |",
        f"| `icr_unet_large`'s U-Net, 1 × 16 × 16 | {u['params'] / 1e6:.2f} M | {u['forward_gflop']:.3f} GFLOP | "
        f"{u['train_gflop_per_sample']:.3f} GFLOP | {tap_icr:.3f} GFLOP |",
        f"H100 SXM, {gpu['bf16']:.0f} TFLOP/s dense bf16 at {100 * gpu['utilization']:.0f} % utilization "
        f"(~{round(rate, -2):.0f} TFLOP/s achieved)",
        f"| {epochs} | {train:.3f} PFLOP ({steps} steps) | {meas:.2f} PFLOP = {d['measure_over_train_epoch']:.1f} epochs | "
        f"{pct(d['fraction']['every epoch'])} | **{pct(d['fraction']['log'])}** (shipped) | "
        f"{pct(d['fraction']['log, val loop limited to 1024 samples'])} |",
        f"| the same with the paper's M = 10⁴ and the full validation set | {epochs} | {train:.3f} PFLOP | {m4:.2f} PFLOP = "
        f"{m4 / train:.1f} epochs | {pct(every4)} ({hours4:.1f} GPU-h) | {pct(log4)} | {pct(lim4)} |",
        f"| `edm_cifar10` (teacher, no monitors) | {e['epochs']} | {e['train_pflop_per_epoch']:.2f} PFLOP | — | "
        f"{pct(e['fraction']['every epoch'])} (val loop only) | {pct(e['fraction']['log'])} | "
        f"{pct(e['fraction']['log, val loop limited to 1024 samples'])} |",
        f"| `icr_unet_large` (ICR + memorization) | {u['epochs']} | {1000 * u['train_pflop_per_epoch']:.2f} TFLOP | "
        f"{1000 * sum(u['measure_pflop'].values()):.2f} TFLOP | {pct(u['fraction']['every epoch'])} | {pct(u['fraction']['log'])} | "
        f"{pct(u['fraction']['log, val loop limited to 1024 samples'])} |",
        f"`log` measures at passes {', '.join(map(str, log_schedule(epochs)))}: {d['log_passes']} of {epochs} epochs",
        f"none that measures more than ~{budget / m4:.0f} times",
        f"one E_gen / E_mem evaluation with M = 10⁴ seeds costs {m4 / train:.1f} training epochs",
        f"an epoch of data-limited distillation is only {steps} steps (N = 4096) while the evaluation is "
        f"{f'{1e4 * nfe:,.0f}'.replace(',', ' ')} student forwards",
        f"the **`log` schedule with M ≤ {int(d['max_num_eval_log_20pct'])}** (`num_eval: 1024` gives "
        f"**{100 * d['fraction']['log']:.0f} %**: {d['log_passes']} evaluations of "
        f"{f'{round(meas / fwd):,}'.replace(',', ' ')} forwards, 1024 × {nfe} + 2 × 1024)",
        f"costs {full / train:.2f} training epochs *every epoch* ({100 * full / (full + train):.0f} % of the run on its own)",
        f"+ {m4:.2f} PFLOP, {pct(with_final(meas))} in all with `num_eval: 1024` for the log-scheduled one, "
        f"{pct(with_final(m768))} with 768",
        f"measures only its validation loss ({pct(e['fraction']['every epoch'])}, "
        f"{pct(e['fraction']['log, val loop limited to 1024 samples'])} with `limit_val_batches: 8`)",
        f"({pct(u['fraction']['every epoch'])} every epoch, {pct(u['fraction']['log'])} with `log`)",
        f"(M × {nfe} teacher forwards: {teacher4:.1f} PFLOP for M = 10⁴, ~{teacher4 * 1000 / rate:.0f} s at 400 TFLOP/s)",
        f"**{emp4 / 1e13:.2f} · 10¹³** FLOP for M = 10⁴",
        f"(16 % of a {epochs}-epoch run on an H100, from flop counts; the paper's M = 10⁴ every epoch would be "
        f"{100 * every4:.0f} %)",
        f"(67 TFLOP/s on an H100)",
    ]) == [] and f"{100 * d['fraction']['log']:.0f}" == "16" and gpu["fp64"] == 67.0
    assert d["fraction"]["log"] <= 0.2 and budget / m4 < 3.5


def test_the_memory_and_compile_sections_are_the_record():
    b = _bench()
    mem, mc = b["memory"]["rows"][0], b["memory"]["config"]
    mlp, unet = b["compile"]["rows"]
    emp4 = _budget("distill_vp_cifar10")["once_pflop"]["empirical_flow"] * 1e4 / 1024 * 1e15
    assert mc == {"M": 4096, "N": 4096, "D": 3072, "batch": 256, "chunk": 4096, "threads": 1}
    assert mlp["max_rel_diff_vs_eager"] == 0 and mlp["break_even_evaluations"] is None
    assert _missing("docs/performance.md", [
        f"At this CPU's rate it takes ~{emp4 / (mem['gflops_rate'] * 1e9) / 60:.1f} min (M = {mc['M']} took "
        f"{mem['seconds']:.0f} s wall, below)",
        f"is {mem['bound_mb']:.0f} MB; the measured peak resident-set increase was **{mem['peak_mb']:.0f} MB, "
        f"{mem['peak_mb'] / mem['bound_mb']:.2f} × the bound** ({mem['gflop'] / 1000:.1f} TFLOP in {mem['seconds']:.0f} s wall on one thread",
        f"| MLP (quickstart net), M = 256 | {mlp['compile_seconds']:.0f} s | {mlp['ratio']:.2f} wall, {mlp['ratio_cpu']:.2f} CPU | never |",
        f"| `unet1` at 3 × 16 × 16, M = 32 | {unet['compile_seconds']:.0f} s | {unet['ratio']:.2f} wall, {unet['ratio_cpu']:.2f} CPU | "
        f"~{unet['break_even_evaluations']:.0f} evaluations |",
        f"bit-identical for the MLP, {_sci(unet['max_rel_diff_vs_eager'], 1)} relative for a U-Net",
        f"compiling takes {mlp['compile_seconds']:.0f}–{unet['compile_seconds']:.0f} s for ≤ "
        f"{100 * (1 - min(mlp['ratio_cpu'], unet['ratio_cpu'])):.0f} %",
    ]) == [] and "M = 256" in mlp["measured"] and "M = 32" in unet["measured"]


# ----------------------------------------------------------------------------- docs/performance.md: the GPU record
def test_the_performance_gpu_numbers_are_the_gpu_record():
    g = _bench("results_gpu.json")
    rates, emp, flow = g["env"]["rates_tflops"], g["empirical"]["seconds_35_calls"], g["flow"]
    sc = g["sample_compile"]
    row = lambda f: (f["eager_fp32"]["measure_s"], f["eager_bf16"]["measure_s"], f["compile_default"]["measure_s"],  # noqa: E731
                     f["compile_reduce_overhead"]["measure_s"], f["compile_reduce_overhead"]["first_measure_s"])
    (e1, b1, c1, r1, f1), (e2, b2, c2, r2, f2) = row(flow["mlp"]), row(flow["unet1"])
    compiled = [flow[n][v]["max_rel_endpoint_diff_vs_eager_fp32"] for n in flow if n != "section_seconds"
                for v in ("compile_default", "compile_reduce_overhead")]
    bf16 = [flow[n]["eager_bf16"]["max_rel_endpoint_diff_vs_eager_fp32"] for n in ("mlp", "unet1")]
    pfd = max(v for k, v in sc["quickstart"]["max_rel_diff_compiled_vs_eager"].items() if k.startswith("pfd/"))
    extra = {c: sc[c]["seconds"]["reduce-overhead"] - sc[c]["seconds"]["eager"] for c in ("quickstart", "lim_precip")}
    assert max(compiled) <= 5e-7 and sc["quickstart"]["max_rel_diff_compiled_vs_eager"]["mem/ratio"] == 0
    assert set(sc["lim_precip"]["max_rel_diff_compiled_vs_eager"].values()) == {0.0}
    assert {flow[n][v]["dynamo_frames_on_second_measure"] for n in ("mlp", "unet1") for v in flow[n] if isinstance(flow[n][v], dict)} == {0}
    fit = g["fit"]
    metrics = fit["epoch2_metrics_uninterrupted_vs_resumed"]
    assert {v["abs_diff"] for v in metrics.values()} == {0.0} and "--trainer.max_epochs 3" in fit["full"]["cmd"] \
        and "--trainer.max_epochs 2" in fit["part"]["cmd"] and "--ckpt_path" in fit["resume"]["cmd"]
    cfgs = {k: v for k, v in g["configs"].items()}
    shipped = {p.stem for p in (ROOT / "lightning_pfd/configs").glob("*.yaml")} | \
        {f"experiments/{p.stem}" for p in (ROOT / "lightning_pfd/configs/experiments").glob("*.yaml")}
    assert {c["rc"] for c in cfgs.values()} == {0} and not any(c["nonfinite_keys"] for c in cfgs.values())
    assert shipped - set(cfgs) == {"distill_vp_cifar10", "edm_cifar10", "experiments/double_descent_study",
                                   "experiments/double_descent_cifar10_gpu"} and set(cfgs) <= shipped
    batches = g["meta"]["argv"][g["meta"]["argv"].index("--config-batches") + 1]
    assert _missing("docs/performance.md", [
        f"(H100: {rates['float64']:.1f} vs {rates['float32_ieee']:.1f} TFLOP/s;",
        f"samples {e1 / r1:.1f}× (MLP) and {e2 / r2:.1f}× (`unet1`) faster than eager after a {f1:.0f}-s / {f2:.0f}-s compile",
        f"| MLP ({flow['mlp']['params'] / 1e6:.2f} M), M = {flow['mlp']['m']} | {e1:.3f} | {b1:.3f} | {c1:.3f} | **{r1:.3f}** "
        f"({e1 / r1:.1f}×) | {f1:.1f} s: pays after ~{f1 / (e1 - r1):.0f} measurements |",
        f"| `unet1` ({flow['unet1']['params'] / 1e6:.2f} M), 3 × 32 × 32, M = {flow['unet1']['m']} | {e2:.3f} | {b2:.3f} | "
        f"{c2:.3f} | **{r2:.3f}** ({e2 / r2:.1f}×) | {f2:.0f} s: pays after ~{f2 / (e2 - r2):.0f} |",
        f"(bf16 autocast: {_sci(max(bf16), 1)})",
        f"(`sample_compile` section, 2 epochs of {batches}",
        f"logs E_gen / E_mem within {_sci(pfd, 0)} relative of the eager run",
        f"once (+{extra['quickstart']:.0f} s and +{extra['lim_precip']:.0f} s)",
        f"(float64 {rates['float64']:.1f}, IEEE float32 {rates['float32_ieee']:.1f}, TF32 {rates['tf32']:.1f}, "
        f"bf16 {rates['bf16']:.1f} TFLOP/s)",
        f"H100, the float32 search {emp['mixed, float32 search forced'] / emp['float64']:.1f}× slower",
        f"all {len(metrics)} logged metrics of epoch 2 bit-identical",
        f"for one short epoch ({len(cfgs)} configs;",
    ]) == []


def test_the_thread_table_and_its_prose_are_the_record():
    t = _bench("threads_result.json")
    idle, busy = t["seconds"]["idle"], t["seconds"]["one busy process"]
    names = {"torch default (2 threads, OMP spin)": "torch default (2 threads, OpenMP spin-wait)",
             "2 threads, OMP_WAIT_POLICY=PASSIVE": "2 threads, passive wait", "1 thread": "1 thread",
             "auto (default)": "auto (the default: passive wait, threads = free cores)"}
    spin, auto, passive = "torch default (2 threads, OMP spin)", "auto (default)", "2 threads, OMP_WAIT_POLICY=PASSIVE"
    others = [busy[k] for k in busy if k != spin]
    assert min(idle, key=idle.get) == spin and max(busy, key=busy.get) == spin
    assert busy[auto] / min(busy.values()) - 1 < 0.03  # "auto is within 3 % of the best policy there"
    assert _missing("docs/performance.md", [
        f"(2-epoch quickstart, one run each" if t["epochs"] == 2 else "(epochs differ)",
        *[f"| {names[k]} | {idle[k]:.1f} s | {busy[k]:.1f} s |" for k in idle],
        f"the spinning default is the slowest ({busy[spin] / max(others):.1f}–{busy[spin] / min(others):.1f}× the others)",
        f"idle it is {idle[auto] - idle[spin]:.1f} s slower than the fastest (the spinning default) and "
        f"{idle[passive] - idle[auto]:.1f} s faster than 2 threads with passive waits",
        f"in this run with one busy process ({busy[spin] / busy[auto]:.1f}×)",
    ]) == []


# ----------------------------------------------------------------------------- docs/empirical_denoiser.md
def test_the_empirical_denoiser_cpu_and_gpu_tables_are_the_records():
    b = _bench()["empirical"]
    raw, c = b["raw"], b["config"]
    row = {d: _row("empirical", f"EmpiricalDenoiser mixed ({d} data)", "float32")["ratio"] for d in ("smooth", "iid")}
    dense = {d: round(35 * raw[d]["calls_mostly_dense"]) for d in raw}
    share = sorted(100 * raw[d]["time_share_of_dense_calls"] for d in raw)
    calls = sorted(100 * raw[d]["calls_mostly_dense"] for d in raw)
    sp = sorted(raw[d]["speedup_vs_float64"] for d in raw)
    assert (c["n"], c["shape"], c["m"], c["threads"], c["nfe"]) == (2048, [3, 32, 32], 256, 1, 35)
    assert all(raw[d]["all_within_1e-9"] for d in raw)
    cell = lambda d: (f"{raw[d]['rate_vs_float32']:.2f}", f"{row[d]:.2f}", f"{raw[d]['speedup_vs_float64']:.2f}",  # noqa: E731
                      f"{raw[d]['float32_over_float64_rate']:.2f}", dense[d], f"{100 * raw[d]['time_share_of_dense_calls']:.0f}")
    s, i = cell("smooth"), cell("iid")
    assert _missing("docs/empirical_denoiser.md", [
        f"quiet machine, commit {b['meta']['commit']}; `benchmarks/results.md`",
        f"| smooth images | {s[0]} (time {s[1]} × the float32 floor) | {s[2]} | {s[3]} | {s[4]} of 35 | {s[5]} % | yes |",
        f"| iid noise | {i[0]} ({i[1]} ×) | {i[2]} | {i[3]} | {i[4]} of 35 | {i[5]} % | yes |",
        f"{calls[0]:.0f}–{calls[1]:.0f} % of the calls and {share[0]:.0f}–{share[1]:.0f} % of the mixed time",
        f"the ceiling here is ≈ {raw['smooth']['rate_vs_float32']:.2f} of the float32 rate, {sp[0]:.1f}–{sp[1]:.1f}× the float64 denoiser",
        f"(8 of the 18 steps, {dense['iid']} of the 35 calls) is dense for both data sets; smooth data is also mostly dense at "
        f"σ = 3.26 ({dense['smooth'] - dense['iid']} more calls)",
    ]) == [] and f"{raw['smooth']['rate_vs_float32']:.2f}" == f"{raw['iid']['rate_vs_float32']:.2f}"
    g = _bench("results_gpu.json")
    e, rates = g["empirical"], g["env"]["rates_tflops"]
    t, f64 = e["seconds_35_calls"], e["seconds_35_calls"]["floor float64"]
    f32, tf = t["floor float32 (IEEE)"], t["floor TF32"]
    ties = e["near_ties_err_vs_longdouble"]
    tf32_sigmas = {round(p["sigma"], 1) for p in e["per_sigma"] if p["search_mode"] == "tf32"}
    closer = [ties[s]["float64"] / ties[s]["search"] for s in ties] + [6.4e-7 / 9.1e-9]  # + the CPU row (not recorded)
    assert (e["config"]["n"], e["config"]["m"], e["config"]["shape"]) == (4096, 4096, [3, 32, 32]) and e["float64_matmul_is_fast"]
    assert _missing("docs/empirical_denoiser.md", [
        f"| floors: float64 / IEEE float32 / TF32 matmuls of the same shapes | {f64:.3f} / {f32:.3f} / {tf:.3f} | 1.00 / "
        f"{f32 / f64:.2f} / {tf / f64:.2f} |",
        f"| `EmpiricalDenoiser(precision=\"float64\")` | {t['float64']:.3f} | {t['float64'] / f64:.2f} |",
        f"| `\"mixed\"` (the default: runs the float64 algorithm here) | {t['mixed (default)']:.3f} | {t['mixed (default)'] / f64:.2f} |",
        f"| the float32 search forced (`float64_fast = False`) | {t['mixed, float32 search forced']:.3f} | "
        f"{t['mixed, float32 search forced'] / f64:.2f} |",
        f"(measured {rates['float64']:.1f} vs {rates['float32_ieee']:.1f} TFLOP/s on 8192³ products)",
        f"cannot use TF32 ({rates['tf32'] / 1000:.2f} PFLOP/s)",
        f"only at σ ≈ {tf32_sigmas.pop():.1f} ({e['search_fp32_modes']['tf32']} of the 35 calls)",
        f"its bookkeeping ({t['mixed, float32 search forced'] / t['float64']:.1f}× slower than float64)",
        f"the search (≈ {e['ratios']['mixed, float32 search forced']:.1f} float32 floors measured here",
        f"every Heun call within {_sci(max(e['heun_calls_max_err_vs_bruteforce'].values()), 1)} of a float64 brute force",
        *[f"| {s} (H100, N = {e['config']['n']}) | {_sci(ties[s]['search'], 1)} | {_sci(ties[s]['float64'], 1)} | "
          f"{_sci(ties[s]['bruteforce_float64'], 1)} |" for s in ties],
        f"{min(closer):.0f}–{max(closer):.0f}× closer to it than the float64 algorithm",
    ]) == [] and not tf32_sigmas


# ----------------------------------------------------------------------------- docs/pfd.md and docs/events.md
def test_the_pfd_page_benchmarks_are_the_records():
    r = _bench("pfd_empirical_result.json")
    a, res = r["args"], {(x["method"], x["chunk"]): x for x in r["results"]}
    mm, naive = res[("matmul", 0)], res[("naive", 0)]
    chunks = [res[("empirical", c)] for c in a["chunks"]]
    secs, pct = [x["seconds"] for x in chunks], [100 * x["gflops"] / mm["gflops"] for x in chunks]
    tv, mb = [x["seconds"] / naive["seconds"] for x in chunks], [x["peak_mem_increase_mb"] for x in chunks]
    line = lambda label, x: (f"| {label} | {x['seconds']:.3f} | {x['gflops']:.1f} | {100 * x['gflops'] / mm['gflops']:.0f} % | "  # noqa: E731
                             f"{x['seconds'] / naive['seconds']:.2f}x | {x['peak_mem_increase_mb']:.0f} |")
    assert (a["n"], a["d"], a["m"], a["threads"]) == (4096, 3072, 1024, 1) and {x.get("max_abs_diff_vs_other", 0) for x in r["results"]} == {0}
    assert _missing("docs/pfd.md", [
        f"`EmpiricalDenoiser` at N = {a['n']}, D = {a['d']}, M = {a['m']}: {min(secs):.2f}–{max(secs):.2f} s = "
        f"**{min(pct):.0f}–{max(pct):.0f} % of the machine's measured float64 matmul rate** ({mm['gflops']:.1f} GFLOP/s), "
        f"{min(tv):.2f}–{max(tv):.2f}× the time of a naive cdist + softmax with {min(mb):.0f}–{max(mb):.0f} MB instead of "
        f"{naive['peak_mem_increase_mb']:.0f} MB extra memory",
        f"--repeats {a['repeats']}`)",
        f"costs 4·M·N·D = {4 * a['m'] * a['n'] * a['d'] / 1e9:.1f} GFLOP",
        f"best of {a['repeats']} rounds",
        line("matmul peak (2 × mm on the same shapes)", mm), line("naive cdist + softmax", naive),
        *[line(f"EmpiricalDenoiser chunk={c}", x) for c, x in zip(a["chunks"], chunks)],
        f"{100 * (1 - max(tv)):.0f}–{100 * (1 - min(tv)):.0f} % faster than the naive version, with "
        f"{naive['peak_mem_increase_mb'] / mb[0]:.0f}× less extra memory at chunk {a['chunks'][0]}",
        f"A full Heun-18 flow is 35 calls: ≈ {35 * statistics.mean(secs):.0f} s for these sizes on one core",
    ]) == []
    cfg = _bench()["monitors"]["config"]
    g, gl = _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 student"), _row("monitors", "GeneralizationMonitor, per epoch", "M x 35 + 2")
    cold, load = _row("monitors", "GeneralizationMonitor, first epoch"), _row("monitors", "GeneralizationMonitor, references loaded")
    n = cfg["generalization"]
    assert _missing("docs/pfd.md", [
        f"**{g['ratio_cpu']:.2f}×** the bare M × 35 student forward passes (M = {n['num_eval']}, warm cache; "
        f"{gl['ratio_cpu']:.2f}× with the 2 × {n['num_loss_samples']} frozen-loss forwards in the floor; the cold first epoch "
        f"{cold['ratio_cpu']:.2f}× its floor",
        f"`benchmarks/results.md`, commit {_bench()['monitors']['meta']['commit']}, a quiet machine",
        f"(student MLPNet(dim {cfg['net']['dim']}, hidden {cfg['net']['hidden']}, depth {cfg['net']['depth']}), "
        f"N = {cfg['data']['n_train']}, {cfg['data']['n_test']} held-out samples in the frozen losses, M = {n['num_eval']})",
        f"| bare M × 35 student forward passes (the floor) | {g['floor_cpu_seconds']:.3f} | 1.00 |",
        f"| {g['cpu_seconds']:.3f} | **{g['ratio_cpu']:.2f}** (target ≤ 1.2; {gl['ratio_cpu']:.2f} with the 2 × 512 loss "
        "forwards in the floor) |",
        f"| loading both cached references at run start | {load['cpu_seconds']:.4f} | {load['ratio_cpu']:.2f} |",
        f"| {cold['cpu_seconds']:.3f} | {cold['ratio_cpu']:.2f} of its floor (student + teacher + empirical flows + loss "
        f"forwards: {cold['floor_cpu_seconds']:.3f} s) |",
        f"(with them in the floor the ratio is {gl['ratio_cpu']:.2f})",
    ]) == []


def test_the_per_unit_cost_in_events_is_the_record():
    r = _row("per_unit", "per-seed d²")
    assert r["meets_goal"] and _missing("docs/events.md", [
        f"Keeping them costs {100 * r['ratio']:.1f} % of the GeneralizationMonitor's measurement (`python benchmarks/run.py "
        "--sections per_unit`)",
    ]) == []


# ----------------------------------------------------------------------------- docs/levy.md: levy_exact_score.json
def test_the_exact_score_table_and_the_truncation_figures_are_the_record():
    rec = _rec("levy_exact_score.json")
    rows = _doc_table("docs/levy.md", "| sampler | grid | steps (network calls) |")
    assert len(rows) == len(rec["samplers"]) == 5
    wrong = []
    for row, s in zip(rows, rec["samplers"]):
        med, mx = (c.strip() for c in row[3].split("/"))
        ok = (row[0].split()[0] == f"`{s['sampler']}`" and row[1] == s["grid"] and row[2] == f"{s['steps']} ({s['network_calls']})"
              and _close(med, s["median_distance"]) and _close(mx, s["max_distance"]))
        if not ok:
            wrong.append((row, s))
    assert wrong == []
    ode50, f, fl = rec["samplers"][0], rec["factor"], rec["floor_r_t_min_eps"]
    heun100 = [s for s in rec["samplers"] if (s["sampler"], s["steps"]) == ("heun", 100)][0]
    text = _page("docs/levy.md")
    m = re.search(r"\((\S+) is the floor r\(t_min\)·\|ε\| of stopping at t_min = 1e-5;", text)
    assert m and _close(m.group(1), fl["median"]) and _close(m.group(1), heun100["median_distance"])
    m = re.search(r"The former sampler's (\S+) is (\S+) per pixel RMS", text)
    assert m and _close(m.group(1), ode50["median_distance"]) and _close(m.group(2), ode50["median_rms_per_pixel"])
    a = rec["args"]
    assert (a["samples"], a["nodes"], rec["n_crops"], rec["pixels"], f["draws"]) == (64, 64, 2048, 256, 10 ** 6)
    top = {t["k"]: t for t in rec["crop_maxima"]["top"]}
    h = rec["hill_coverage"]
    assert _missing("docs/levy.md", [
        f"empirical distribution of the {rec['n_crops']} training crops (16×16, training space), exact score of the "
        f"sub-Gaussian noise with the factor A discretised on {a['nodes']} quantile nodes (clamped at {rec['clamp_A']:g} as in "
        f"training), {a['samples']} samples from the clamped α-stable prior",
        f"c_α = 2cos(π·1.7/4)^{{2/1.7}} = {f['c_alpha']:.3f}, the median of A is {f['median']:.2f}, P(A ≥ 20) = "
        f"{100 * f['p_ge_20']:.2f} % and P(A ≥ {f['threshold_20_c_alpha']:.2f}) = {100 * f['p_ge_20_c_alpha']:.2f} % "
        "(10⁶ seeded draws, `levy_exact_score.json`)",
        f"10⁶ seeded draws give {100 * f['p_ge_20_over_kappa']:.2f} % / {100 * f['p_ge_20']:.2f} %, `levy_exact_score.json`",
        f"A_std ≥ 20/κ = **{f['threshold_20_over_kappa']:.1f} at α = 1.7**",
        f"({top[40]['distinct']} distinct values among the top 40: {rec['crop_maxima']['max_mm_h']:.2f} mm/h six times; "
        "`levy_exact_score.json`)",
        f"measured {h['bootstrap_covers']}/{h['data_sets']} = {100 * h['bootstrap_covers'] / h['data_sets']:.0f} % for the 90 % "
        f"bootstrap interval against {h['naive_covers']}/{h['data_sets']} = {100 * h['naive_covers'] / h['data_sets']:.0f} % "
        "for the naive",
        f"with the exact score the flow lands within {heun100['median_distance']:.4f} of a training crop, the median of "
        "`levy_exact_score.json`",
    ]) == [] and top[40]["count_of_max"] == 6 and f"{f['kappa']:.3f}" == "0.474"


def test_the_levy_timings_and_run_notes_are_the_pite_records():
    v4, part, v3, v2 = (_rec(f"pite_{v}.json") for v in ("v4", "v4_partial", "v3", "v2"))
    wall = {tuple(p["runs"].items())[0][0] + ":" + p["runs"][tuple(p["runs"])[0]][0]: p["wall_s"]
            for p in v4["merged_from"] if len(p["runs"]) == 1}
    quiet = [wall[k] for k in wall if k.startswith(("lim_ref:", "lim_x0A:"))]
    assert sorted(k for k in wall if k.startswith(("lim_ref:", "lim_x0A:"))) == \
        ["lim_ref:0", "lim_ref:1", "lim_ref:2", "lim_ref:3", "lim_ref:4", "lim_x0A:3", "lim_x0A:4"]
    assert "at load 17-50" in part["note"] and "at load ~5" in part["note"]
    lim_ref_max = max(v4["runs"]["lim_ref"][s]["out_of_range"]["max"] for s in v4["runs"]["lim_ref"])
    assert _missing("docs/levy.md", [
        f"({wall['sbm_edm:3']:.0f} / {wall['sbm_edm:4']:.0f} s for SBM on a machine at load 17–50; LIM "
        f"{wall['lim:3']:.0f} / {wall['lim:4']:.0f} s once the load fell to ≈ 5: the note of `pite_v4_partial.json`)",
        f"one after the other on a quiet core: {min(quiet):.0f}–{max(quiet):.0f} s each",
        f"the merge: {v4['wall_s']:.1f} s",
        f"a restarted SBM seed 0 gave RMSQE {v4['runs']['sbm_edm']['0']['metrics']['max']['rmsqe']:.1f} again",
        f"up to {lim_ref_max:.1f} in training space against the data's 1",
    ]) == []
    for phrase in ("22 min 23 s", "13 min 41 s"):  # pite_v3.json's machine note
        assert phrase in v3["machine"] and phrase in _page("docs/levy.md"), phrase
    assert "(load average ~5)" in v2["machine"] and "(load average ≈ 5)" in _page("docs/levy.md")


# ----------------------------------------------------------------------------- docs/getting-started.md, docs/sweeps_analysis.md
def test_the_pointers_that_replaced_pilot_figures_hold():
    """getting-started's N = 4096 quickstart is described in words and pointed at the recorded
    sweep, whose quickstart-sized model (0.64M) has E_gen < E_mem at the largest N; the provisional
    events are no longer dated."""
    _, cells = _cells()
    top = max(n for _, n in cells)
    e_gen, e_mem = cells[(636864, top)]
    assert top == 4096 and e_gen < e_mem
    text = _page("docs/getting-started.md")
    assert "the recorded sweep of [Sweeps](sweeps.md) has the same ordering at large N" in text
    assert "announced at epoch" not in text


def test_the_calibration_run_times_in_sweeps_analysis_are_the_records():
    deform, cov = _rec("collapse_gof_deformation.json"), _rec("collapse_coverage.json")
    settings = deform["summary"]["gof"]
    per = max(deform["wall_seconds_parts"]) / (len(settings) // len(deform["wall_seconds_parts"]) * deform["config"]["sweeps"])
    cpu = sum(c["cpu_seconds"] for c in cov["coverage"]) + sum(g["cpu_seconds"] for g in cov["gof"])
    assert len(settings) == 10 and len(deform["wall_seconds_parts"]) == 2
    assert _missing("docs/sweeps_analysis.md", [
        f"(two processes of five settings each, {max(deform['wall_seconds_parts']) / 60:.0f} min wall on 2 cores; "
        f"≈ {per:.1f} s per sweep.)",
        f"took {max(cov['wall_seconds_parts']) / 60:.0f} min wall on the shared 2-core machine "
        f"({len(cov['wall_seconds_parts'])} processes, one per setting",
        f"{cpu:.0f} CPU-seconds in all",
    ]) == [] and math.isclose(per, 2.24, abs_tol=0.01)
