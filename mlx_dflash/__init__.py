"""mlx-dflash: lossless DFlash speculative decoding on stock mlx_lm."""

__version__ = "0.1.0"
