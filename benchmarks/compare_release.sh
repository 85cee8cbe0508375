#!/usr/bin/env bash
# Run the quickstart and a small U-Net config with one package root and compare the outputs with
# a baseline (byte-identical outputs across a refactor; benchmarks/compare_outputs.py).
#
#   benchmarks/compare_release.sh [--root DIR] [--out DIR] [--name PATTERN] [--against PATTERN]
#                                 [--no-compare] [--only quickstart|unet]
#
#   --root     package root put on PYTHONPATH (default /work/main); `lightning_pfd` must import
#              from there (checked before each run)
#   --out      output folder (default /tmp/pfd_outputs)
#   --name     run folder under --out, %s = config name (default new_%s -> new_quickstart, new_unet)
#   --against  baseline run folders, %s = config name (default /tmp/pfd_outputs/base_%s_1)
#
# The baseline (release a3565d4 in a worktree) was made with
#   git worktree add --detach /tmp/pfd_base a3565d4
#   benchmarks/compare_release.sh --root /tmp/pfd_base --name base_%s_1 --no-compare
#   benchmarks/compare_release.sh --root /tmp/pfd_base --name base_%s_2 --against /tmp/pfd_outputs/base_%s_1
# and a check of the working tree is
#   benchmarks/compare_release.sh            # -> /tmp/pfd_outputs/new_*, compared with base_*_1
#
# Each run folder holds input/ (the configs, copied from --root so that the run reads them by
# the same relative path in every run: hparams.yaml records the --config path), run/ (every
# output: --run_dir run), cache/ (a fresh LIGHTNING_PFD_CACHE), console.log, wall_s.txt and
# provenance.txt. Only run/ is compared. Exit status: 0 when every comparison is identical,
# 1 when one differs, 2 on a usage error or a failed run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=/work/main
OUT=/tmp/pfd_outputs
NAME="new_%s"
AGAINST="/tmp/pfd_outputs/base_%s_1"
COMPARE=1
ONLY=""
PY="${PYTHON:-$(cd "$HERE/.." && pwd)/.venv/bin/python}"  # the project venv unless $PYTHON

while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --name) NAME="$2"; shift 2 ;;
        --against) AGAINST="$2"; shift 2 ;;
        --no-compare) COMPARE=0; shift ;;
        --only) ONLY="$2"; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "compare_release.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
ROOT="$(cd "$ROOT" && pwd)"
if compgen -G "$ROOT/*.egg-info" > /dev/null; then  # an editable install's build folder on PYTHONPATH
    echo "compare_release.sh: warning: $ROOT holds $(cd "$ROOT" && ls -d ./*.egg-info): W&B's requirements.txt" \
         "will list lightning_pfd a second time (move it aside for a byte-identical comparison)" >&2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# The same environment for every run: one CPU thread (the thread count changes float reduction
# order; `auto` would pick it from the machine's load), offline W&B, a fresh cache, no
# credentials, a fixed hash seed.
run_env() {
    env -u WANDB_API_KEY -u LIGHTNING_PFD_THREADS \
        PYTHONPATH="$ROOT" PYTHONHASHSEED=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        WANDB_MODE=offline WANDB_SILENT=true LIGHTNING_PFD_CACHE="$PWD/cache" "$@"
}

# one run: NAME CONFIG_RELATIVE_TO_ROOT PREPARE [extra fit arguments...]
# (PREPARE: a function given the run's input/ folder, or "true")
run_config() {
    local cfg="$1" src="$2" prepare="$3"; shift 3
    local dir; dir="$OUT/$(printf "$NAME" "$cfg")"
    if [ -e "$dir" ]; then
        echo "compare_release.sh: $dir exists; remove it first" >&2; exit 2
    fi
    mkdir -p "$dir/input" "$dir/cache"
    cp "$ROOT/$src" "$dir/input/"
    "$prepare" "$dir/input"
    (
        cd "$dir"  # not the package root: '' on sys.path must not shadow PYTHONPATH
        local where
        where="$(run_env "$PY" -c 'import lightning_pfd; print(lightning_pfd.__file__)')"
        case "$where" in
            "$ROOT"/*) ;;
            *) echo "compare_release.sh: lightning_pfd imports from $where, not $ROOT" >&2; exit 2 ;;
        esac
        {
            echo "root: $ROOT"
            echo "imported: $where"
            echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo '?')"
            echo "changed files:"; git -C "$ROOT" status --short 2>/dev/null || true
        } > provenance.txt
        local args=(-m lightning_pfd --threads 1 fit --config "input/$(basename "$src")"
                    --run_dir run --seed_everything 0 "$@")
        echo "+ (cd $dir && PYTHONPATH=$ROOT ... $PY ${args[*]})"
        local t0=$SECONDS
        if ! run_env "$PY" "${args[@]}" > console.log 2>&1; then
            tail -20 console.log >&2
            echo "compare_release.sh: the $cfg run failed ($dir/console.log)" >&2; exit 2
        fi
        echo $((SECONDS - t0)) > wall_s.txt
        echo "  $cfg: $((SECONDS - t0)) s -> $dir/run"
    )
}

unet_extra_callbacks() {  # monitors the U-Net config lacks: E_mem + sample-grid PNGs, events, report
    cat > "$1/unet_extra_callbacks.yaml" <<'EOF'
- class_path: lightning_pfd.callbacks.GeneralizationMonitor
  init_args: {num_eval: 64, num_loss_samples: 256, image_every_n_epochs: 2, num_images: 8}
- class_path: lightning_pfd.callbacks.RegimeMonitor
  init_args: {window: 3, confirm: 2, write_report: true}
EOF
}

# quickstart: every monitor of the config, 250 steps per epoch, 12 of its 24 epochs (release
# a3565d4: two provisional events at epoch 7, early learning retracted and memorization onset moved
# to epoch 5 by the final test, regime memorization; W&B offline media, report, figures)
if [ -z "$ONLY" ] || [ "$ONLY" = quickstart ]; then
    run_config quickstart lightning_pfd/configs/quickstart.yaml true --trainer.max_epochs 12
fi
# U-Net: icr_unet_small (ICR x2, memorization, ICR early stopping, checkpoint) for 6 epochs of
# 50 steps, plus a GeneralizationMonitor (E_mem, losses, sample-grid PNGs under csv/version_0/
# figures: no W&B logger here) and a RegimeMonitor (events.json, report.md, its two PNGs)
if [ -z "$ONLY" ] || [ "$ONLY" = unet ]; then
    run_config unet lightning_pfd/configs/experiments/icr_unet_small.yaml unet_extra_callbacks \
        --trainer.callbacks+=input/unet_extra_callbacks.yaml \
        --trainer.max_epochs 6 --data.samples_per_epoch 3200
fi

status=0
if [ "$COMPARE" = 1 ]; then
    for cfg in quickstart unet; do
        if [ -n "$ONLY" ] && [ "$ONLY" != "$cfg" ]; then continue; fi
        echo "== $cfg: $(printf "$AGAINST" "$cfg")/run vs $OUT/$(printf "$NAME" "$cfg")/run"
        "$PY" "$HERE/compare_outputs.py" "$(printf "$AGAINST" "$cfg")/run" \
            "$OUT/$(printf "$NAME" "$cfg")/run" || status=1
    done
fi
exit $status
