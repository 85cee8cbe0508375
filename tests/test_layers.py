"""DESIGN.md's layering rule: the math (diffusion, metrics, nets, analysis) never imports Lightning or W&B."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("pkg", ["diffusion", "metrics", "nets", "analysis"])
def test_pure_layers_do_not_import_lightning_or_wandb(pkg):
    code = (f"import sys, lightning_pfd.{pkg}; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'wandb')]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"lightning_pfd.{pkg} imports {out.stdout.strip()} {out.stderr[-500:]}"
