"""lightning_pfd: train diffusion models and measure how they generalize or memorize."""
__version__ = "0.1.0"
