"""Compare the outputs of two runs file by file (byte-identical outputs across a refactor).

    python benchmarks/compare_outputs.py RUN_A RUN_B [--max-lines 40] [--max-rows 5] [--quiet]

Every file under RUN_A and RUN_B is listed by its relative path and compared byte for byte.
When two files differ, the report says how:

* ``*.csv`` (metrics.csv): the first differing rows and columns (both values);
* ``*.npz`` (per_unit/<key>/epoch_*.npz): array by array, equal or the max abs difference;
* ``*.png`` (figures): the decoded pixels (``matplotlib.image.imread``), identical or not;
* ``*.json``, ``*.md``, ``*.yaml``, ``*.txt``, ``*.log`` (events.json, detector_settings.json,
  report.md, ...): a unified diff (``--max-lines`` lines);
* ``*.ckpt``: the tensors of the checkpoints (torch), equal or the max abs difference;
* anything else: only that the bytes differ.

Files on one side only are reported; symbolic links (W&B's ``latest-run``) are compared by target.

What two identical runs do not share (measured: two runs of each config of
benchmarks/compare_release.sh with the release a3565d4, compared with this script; each entry
says why it is run-dependent; ``--rules`` prints them) is handled by these tables, nothing else:

* :data:`RENAMES`: parts of file *names* replaced before the files of A and B are paired
  (W&B's ``offline-run-<time>-<id>`` folder, ``run-<id>.wandb``, media content hashes);
* :data:`RUN_DEPENDENT`: files listed but not compared (W&B's binary log and debug logs);
* :data:`TEXT_MASKS`: W&B's copy of the console (``files/output.log``), compared after masking
  the progress bar's last frame, the W&B run folder and the run folder's absolute path;
* :data:`CKPT_MASKS`, :data:`CKPT_SKIP`: ``*.ckpt``, compared entry by entry after masking the
  run folder's absolute path and the W&B run id, without the integrity digest over them.

A file equal only after its masks is reported ``EQUIV`` and counts as identical. metrics.csv,
per_unit/*.npz, events.json, detector_settings.json, report.md, config.yaml, hparams.yaml and
every PNG are compared byte for byte, nothing masked. Exit status: 0 when everything is
identical (or EQUIV), 1 otherwise, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import fnmatch
import hashlib
import io
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: (pattern, replacement, why) applied to relative paths before pairing the files of A and B
RENAMES: List[Tuple[str, str, str]] = [
    (r"(^|/)offline-run-\d{8}_\d{6}-[a-z0-9]+(/|$)", r"\1offline-run-*\2",
     "W&B run folder (also the target of wandb/latest-run, wandb/debug*.log): start time and "
     "random run id"),
    (r"(^|/)run-[a-z0-9]+\.wandb$", r"\1run-*.wandb", "W&B transaction log: named by the run id"),
    (r"(/files/media/.+_\d+)_[0-9a-f]{20}(\.[a-z.]+)$", r"\1_<sha256>\2",
     "W&B media file <key>_<step>_<sha256 of the content>: paired by key and step so that a "
     "content difference is explained (not hidden: the bytes are compared)"),
]

#: (glob on the renamed relative path, why) files listed but whose content is not compared
RUN_DEPENDENT: List[Tuple[str, str]] = [
    ("*wandb/offline-run-*/run-*.wandb",
     "W&B binary transaction log: wall-clock timestamps, run id, host/process metadata"),
    ("*wandb/offline-run-*/logs/debug*.log",
     "W&B internal logs: every line starts with a timestamp and a process id (debug-core.log: a "
     "link to ~/.cache/wandb/logs/core-debug-<start time>.log)"),
]

#: text files compared after these replacements (glob, regex, replacement, why); the run folder's
#: absolute path is replaced by <RUN_DIR> in them as well
TEXT_MASKS: List[Tuple[str, str, str, str]] = [
    ("*wandb/offline-run-*/files/output.log", r"(?ms)^Epoch \d+/\d+ .*?\n\n", "<progress bar>\n\n",
     "W&B's copy of the console: the progress bar's last frame shows elapsed/remaining time, "
     "it/s and v_num (the W&B run id's last characters); its metric values are in metrics.csv"),
    ("*wandb/offline-run-*/files/output.log", r"offline-run-\d{8}_\d{6}-[a-z0-9]+", "offline-run-*",
     "the W&B run folder printed at the end (start time, run id)"),
]

#: what a checkpoint (``*.ckpt``, compared entry by entry when its bytes differ) may hold that
#: depends on the run, replaced in both before comparing: (string, why)
CKPT_MASKS: List[Tuple[str, str]] = [
    ("<RUN_DIR>", "the run folder's absolute path: ModelCheckpoint state (dirpath, best/last/kth "
                  "model paths, best_k_models keys) stores absolute checkpoint paths"),
    ("<WANDB_ID>", "the W&B run id (random; also in the W&B folder's name): the checkpoint's "
                   "logger_locations"),
]
#: checkpoint entries not compared: (prefix of the flattened key, why)
CKPT_SKIP: List[Tuple[str, str]] = [
    ("lightning_pfd_integrity", "the sha256 digest of all the other entries (lightning_pfd.checkpoint."
                                "content_digest), absolute paths and W&B id included; every entry it "
                                "covers is compared itself"),
]

TEXT_SUFFIXES = {".json", ".md", ".yaml", ".yml", ".txt", ".log"}


def _rename(rel: str) -> str:
    for pattern, repl, _ in RENAMES:
        rel = re.sub(pattern, repl, rel)
    return rel


def rel_files(root: Path) -> Tuple[Dict[str, Path], Dict[str, str]]:
    """(files, links) under ``root``: renamed relative path (posix) -> file, and -> the renamed
    target of each symbolic link (not followed: W&B's ``latest-run``, ``debug.log``)."""
    files: Dict[str, Path] = {}
    links: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = _rename(p.relative_to(root).as_posix())
            if p.is_symlink():
                links[rel] = _rename(os.readlink(p) + ("/" if p.is_dir() else ""))
            elif p.is_file():
                if rel in files:
                    raise SystemExit(f"compare_outputs: two files of {root} map to {rel}")
                files[rel] = p
    return files, links


def run_dependent(rel: str) -> Optional[str]:
    return next((why for glob, why in RUN_DEPENDENT if fnmatch.fnmatch(rel, glob)), None)


# ----------------------------------------------------------------------------- explain a difference
def explain_csv(a: bytes, b: bytes, max_rows: int) -> List[str]:
    ra = list(csv.reader(io.StringIO(a.decode())))
    rb = list(csv.reader(io.StringIO(b.decode())))
    out = []
    if ra[:1] != rb[:1]:
        ha, hb = (ra[0] if ra else []), (rb[0] if rb else [])
        same_order = [c for c in ha if c in hb] == [c for c in hb if c in ha]
        out.append(f"header differs: only A {sorted(set(ha) - set(hb))}, only B "
                   f"{sorted(set(hb) - set(ha))}, common columns in the same order: {same_order}")
    if len(ra) != len(rb):
        out.append(f"rows: A {len(ra) - 1}, B {len(rb) - 1} (without the header)")
    header = ra[0] if ra else []
    shown = 0
    for i, (x, y) in enumerate(zip(ra[1:], rb[1:]), start=1):
        if x == y:
            continue
        cols = [(header[j] if j < len(header) else f"#{j}", u, v)
                for j, (u, v) in enumerate(zip(x, y)) if u != v]
        if len(x) != len(y):
            cols.append(("(row length)", str(len(x)), str(len(y))))
        out.append(f"row {i}: " + "; ".join(f"{c}: A={u!r} B={v!r}" for c, u, v in cols[:6])
                   + (f"; ... {len(cols) - 6} more columns" if len(cols) > 6 else ""))
        shown += 1
        if shown >= max_rows:
            rest = sum(1 for x, y in zip(ra[1 + i:], rb[1 + i:]) if x != y)
            if rest:
                out.append(f"... {rest} more differing rows")
            break
    return out


def explain_npz(pa: Path, pb: Path) -> List[str]:
    import numpy as np

    out = []
    with np.load(pa, allow_pickle=False) as za, np.load(pb, allow_pickle=False) as zb:
        ka, kb = set(za.files), set(zb.files)
        if ka != kb:
            out.append(f"arrays only in A {sorted(ka - kb)}, only in B {sorted(kb - ka)}")
        for k in sorted(ka & kb):
            x, y = za[k], zb[k]
            if x.dtype.kind in "USO" and x.size == 1 and y.size == 1 and x.shape == y.shape:
                if x.item() == y.item() and x.dtype == y.dtype:
                    out.append(f"{k}: equal")
                else:
                    out.append(f"{k}: A={str(x.item())[:150]!r}")
                    out.append(f"{' ' * len(k)}  B={str(y.item())[:150]!r}")
            elif x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"{k}: shape/dtype A {x.shape} {x.dtype}, B {y.shape} {y.dtype}")
            elif np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                out.append(f"{k}: equal")
            elif x.dtype.kind in "biufc":
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                out.append(f"{k}: max abs diff {np.nanmax(d):.3g} ({int((d != 0).sum())} of {d.size} differ)")
            else:
                out.append(f"{k}: differs ({int((x != y).sum())} of {x.size} elements)")
    if all(s.endswith(": equal") for s in out):
        out.append("every array equal: the difference is in the container (zip metadata)")
    return out


def explain_png(pa: Path, pb: Path) -> List[str]:
    import matplotlib.image as mpimg
    import numpy as np

    x, y = mpimg.imread(pa), mpimg.imread(pb)
    if x.shape != y.shape:
        return [f"pixels differ: shape A {x.shape}, B {y.shape}"]
    if np.array_equal(x, y):
        return ["pixels identical (only the PNG encoding/metadata differs)"]
    d = np.abs(x.astype(np.float64) - y.astype(np.float64))
    return [f"pixels differ: {int((d.reshape(d.shape[0], d.shape[1], -1).max(-1) > 0).sum())} of "
            f"{x.shape[0] * x.shape[1]} pixels, max abs diff {d.max():.3g}"]


def mask_text(text: str, rules: List[Tuple[str, str]], run_mask: Dict[str, str]) -> str:
    for old, new in run_mask.items():
        if new == "<RUN_DIR>":
            text = text.replace(old, new)
    for rx, new in rules:
        text = re.sub(rx, new, text)
    return text


def explain_text(a: bytes, b: bytes, rel: str, max_lines: int) -> List[str]:
    lines = list(difflib.unified_diff(a.decode(errors="replace").splitlines(),
                                      b.decode(errors="replace").splitlines(),
                                      f"A/{rel}", f"B/{rel}", lineterm="", n=1))
    more = [f"... {len(lines) - max_lines} more diff lines"] if len(lines) > max_lines else []
    return lines[:max_lines] + more


def _flatten(obj, prefix: str, out: Dict[str, object]) -> Dict[str, object]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = obj
    return out


def _short(key: str) -> str:
    """A checkpoint entry's path without the callbacks' long state keys (``Name{args}``)."""
    return re.sub(r"\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "{..}", key)


def explain_ckpt(pa: Path, pb: Path, masks: Tuple[Dict[str, str], Dict[str, str]],
                 max_lines: int) -> Tuple[List[str], bool]:
    """Every tensor compared exactly; every other value too, after ``masks`` (per side: the run
    folder's absolute path and the W&B run id, see :data:`CKPT_MASKS`) replaced its strings.
    Returns (lines, equivalent)."""
    import torch

    def load(p: Path, mask: Dict[str, str]) -> Dict[str, object]:
        flat = _flatten(torch.load(p, map_location="cpu", weights_only=True), "", {})
        out = {}
        for k, v in flat.items():
            for old, new in mask.items():
                k = k.replace(old, new)
                v = v.replace(old, new) if isinstance(v, str) else v
            out[k] = v
        return out

    a, b = load(pa, masks[0]), load(pb, masks[1])
    for k in [k for k in a.keys() | b.keys() if any(k.startswith(pre) for pre, _ in CKPT_SKIP)]:
        a.pop(k, None), b.pop(k, None)
    diffs = []
    for k in sorted(a.keys() - b.keys()):
        diffs.append(f"only in A: {_short(k)}")
    for k in sorted(b.keys() - a.keys()):
        diffs.append(f"only in B: {_short(k)}")
    n_tensors = 0
    for k in sorted(a.keys() & b.keys()):
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            n_tensors += 1
            if x.shape != y.shape or x.dtype != y.dtype:
                diffs.append(f"tensor {_short(k)}: shape/dtype A {tuple(x.shape)} {x.dtype}, "
                             f"B {tuple(y.shape)} {y.dtype}")
            elif not torch.equal(x, y):
                d = (x.double() - y.double()).abs().max().item() if x.is_floating_point() else "n/a"
                diffs.append(f"tensor {_short(k)}: max abs diff {d}")
        elif type(x) is not type(y) or repr(x) != repr(y):
            diffs.append(f"value {_short(k)}: A={x!r:.60} B={y!r:.60}")
    lines = diffs[:max_lines] + ([f"... {len(diffs) - max_lines} more"] if len(diffs) > max_lines else [])
    if not diffs:
        lines.append(f"equivalent: {n_tensors} tensors and every other value equal after masking "
                     f"{', '.join(sorted(set(masks[0].values())))} (digest {CKPT_SKIP[0][0]} skipped)")
    return lines, not diffs


def explain(rel: str, pa: Path, pb: Path, a: bytes, b: bytes, masks, args) -> Tuple[List[str], bool]:
    """How two differing files differ; (lines, equivalent): only a checkpoint (equal after
    :data:`CKPT_MASKS`) or a file of :data:`TEXT_MASKS` (equal after its masks) can be equivalent;
    every other byte difference is a difference."""
    suffix = pa.suffix.lower()
    try:
        if suffix == ".csv":
            return explain_csv(a, b, args.max_rows), False
        if suffix == ".npz":
            return explain_npz(pa, pb), False
        if suffix == ".png":
            return explain_png(pa, pb), False
        if suffix in TEXT_SUFFIXES:
            rules = [(rx, new) for glob, rx, new, _ in TEXT_MASKS if fnmatch.fnmatch(rel, glob)]
            if rules:
                ma, mb = (mask_text(x.decode(errors="replace"), rules, m)
                          for x, m in ((a, masks[0]), (b, masks[1])))
                if ma == mb:
                    return [f"equivalent after {len(rules)} TEXT_MASKS rules and <RUN_DIR>"], True
                a, b = ma.encode(), mb.encode()
            return explain_text(a, b, rel, args.max_lines), False
        if suffix == ".ckpt":
            return explain_ckpt(pa, pb, masks, args.max_lines)
    except Exception as e:  # a file that does not parse: still a difference, say why
        return [f"(could not compare contents: {type(e).__name__}: {e})"], False
    return [f"bytes differ ({len(a)} vs {len(b)} bytes)"], False


def run_masks(root: Path) -> Dict[str, str]:
    """The run-dependent strings of the run at ``root`` (:data:`CKPT_MASKS`)."""
    mask = {str(root.resolve()): "<RUN_DIR>"}
    for p in root.glob("**/wandb/offline-run-*"):
        m = re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)", p.name)
        if m:
            mask[p.name] = "offline-run-<WANDB_RUN>"
            mask[m.group(1)] = "<WANDB_ID>"
    return mask


# ----------------------------------------------------------------------------- main
def compare(dir_a: Path, dir_b: Path, args) -> int:
    (fa, la), (fb, lb) = rel_files(dir_a), rel_files(dir_b)
    masks = (run_masks(dir_a), run_masks(dir_b))
    counts = {"identical": 0, "equivalent": 0, "different": 0, "only_a": 0, "only_b": 0, "ignored": 0}
    ignored: Dict[str, List[str]] = {}
    for rel in sorted(fa.keys() | fb.keys()):
        why = run_dependent(rel)
        if rel not in fb or rel not in fa:
            if why:  # a run-dependent file absent on one side is reported but not counted
                counts["ignored"] += 1
                ignored.setdefault(why, []).append(rel + (" (only A)" if rel in fa else " (only B)"))
                continue
            side = "only_a" if rel in fa else "only_b"
            counts[side] += 1
            print(f"ONLY {'A' if side == 'only_a' else 'B'}  {rel}")
            continue
        if why:
            counts["ignored"] += 1
            ignored.setdefault(why, []).append(rel)
            continue
        a, b = fa[rel].read_bytes(), fb[rel].read_bytes()
        if a == b:
            counts["identical"] += 1
            if args.verbose:
                print(f"same    {rel}  ({len(a)} bytes, sha256 {hashlib.sha256(a).hexdigest()[:12]})")
            continue
        lines, equivalent = explain(rel, fa[rel], fb[rel], a, b, masks, args)
        counts["equivalent" if equivalent else "different"] += 1
        print(f"{'EQUIV ' if equivalent else 'DIFFER'}  {rel}")
        if not args.quiet or equivalent:
            for line in lines[-1:] if equivalent and args.quiet else lines:
                print(f"        {line}")
    for rel in sorted(la.keys() | lb.keys()):  # symbolic links: the same (renamed) target
        why = run_dependent(rel)
        if why:
            counts["ignored"] += 1
            ignored.setdefault(why, []).append(rel + " (link)")
        elif la.get(rel) == lb.get(rel):
            counts["identical"] += 1
            if args.verbose:
                print(f"same    {rel} -> {la[rel]}")
        elif rel not in lb or rel not in la:
            side = "only_a" if rel in la else "only_b"
            counts[side] += 1
            print(f"ONLY {'A' if side == 'only_a' else 'B'}  {rel} (link)")
        else:
            counts["different"] += 1
            print(f"DIFFER  {rel} (link): A -> {la[rel]}, B -> {lb[rel]}")
    for why, rels in ignored.items():
        print(f"ignored (run-dependent: {why}): {', '.join(rels)}")
    ok = counts["different"] == counts["only_a"] == counts["only_b"] == 0
    print(f"{'IDENTICAL' if ok else 'DIFFERENT'}: {dir_a} vs {dir_b}: {counts['identical']} identical, "
          f"{counts['equivalent']} equal after masking run-dependent strings, "
          f"{counts['different']} different, {counts['only_a']} only in A, {counts['only_b']} only in B, "
          f"{counts['ignored']} run-dependent not compared")
    return 0 if ok else 1


def print_rules() -> None:
    print("renamed before pairing (regex -> replacement):")
    for rx, new, why in RENAMES:
        print(f"  {rx} -> {new}\n      {why}")
    print("listed, not compared:")
    for glob, why in RUN_DEPENDENT:
        print(f"  {glob}\n      {why}")
    print("text masks (file: regex -> replacement; plus the run folder's absolute path -> <RUN_DIR>):")
    for glob, rx, new, why in TEXT_MASKS:
        print(f"  {glob}: {rx!r} -> {new!r}\n      {why}")
    print("checkpoints (entry by entry when the bytes differ):")
    for new, why in CKPT_MASKS:
        print(f"  mask {new}: {why}")
    for pre, why in CKPT_SKIP:
        print(f"  skip {pre}: {why}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="--rules lists what is renamed, skipped or masked, and why.")
    p.add_argument("run_a", type=Path, nargs="?", help="first run directory (e.g. the baseline's run/)")
    p.add_argument("run_b", type=Path, nargs="?", help="second run directory")
    p.add_argument("--rules", action="store_true", help="print the run-dependent rules and exit")
    p.add_argument("--max-lines", type=int, default=40, help="diff lines shown per text file (40)")
    p.add_argument("--max-rows", type=int, default=5, help="differing CSV rows shown per file (5)")
    p.add_argument("-q", "--quiet", action="store_true", help="name the differing files only")
    p.add_argument("-v", "--verbose", action="store_true", help="also list the identical files")
    args = p.parse_args(argv)
    if args.rules:
        print_rules()
        return 0
    if args.run_a is None or args.run_b is None:
        p.error("RUN_A and RUN_B are required")
    for d in (args.run_a, args.run_b):
        if not d.is_dir():
            p.error(f"{d} is not a directory")
    return compare(args.run_a, args.run_b, args)


if __name__ == "__main__":
    sys.exit(main())
