"""OpenAI- and Anthropic-compatible HTTP server around one generation thread."""

from .app import create_app
from .engine import Engine, EngineConfig

__all__ = ["create_app", "Engine", "EngineConfig"]
