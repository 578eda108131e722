"""What a bench result was measured on: Python, MLX, mlx_lm, the device."""

import platform
import subprocess


def environment() -> dict:
    """Versions, platform and device of this process (written into every result)."""
    import mlx.core as mx
    import mlx_lm

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
    }
    try:
        from importlib.metadata import version

        env["mlx_dflash"] = version("mlx-dflash")
    except Exception:
        env["mlx_dflash"] = None
    try:
        info = mx.device_info()
        env["device_info"] = {
            k: v for k, v in info.items() if isinstance(v, (int, str, float))
        }
    except Exception:
        pass
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0:
            env["gpu"] = out.stdout.strip()
    except Exception:
        pass
    try:
        import os

        env["cpu_count"] = os.cpu_count()
    except Exception:
        pass
    return env
