"""A module placed over one module *instance*, never its class.

The model's own forward keeps running unchanged: it calls the wrapper where it
called the module, and reads the module's attributes through it.
"""

import mlx.nn as nn


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def __getattr__(self, key):
        # The model loop reads attributes such as `is_linear` off its layers.
        if key in self:
            return self[key]
        if "inner" not in self:
            raise AttributeError(key)
        return getattr(self["inner"], key)


def innermost(module: nn.Module) -> nn.Module:
    """The module under all its wrappers (taps, kernel wrappers)."""
    while isinstance(module, Wrapper):
        module = module["inner"]
    return module


def class_name(module) -> str:
    """`module`'s class as "package.module.Class": what the wrappers' lists of
    mirrored classes name."""
    return f"{type(module).__module__}.{type(module).__qualname__}"
