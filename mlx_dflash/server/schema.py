"""What every request model shares: unknown fields ignored, strings valid Unicode."""

import logging
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, model_validator

from .common import APIError

log = logging.getLogger(__name__)
_unknown: set = set()  # field names already logged (bounded: clients choose them)


class Lenient(BaseModel):
    """Unknown fields are dropped and logged once by name, as llama-server and
    vLLM do: the next field a client adds must not turn its requests into 400s."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _log_unknown(cls, data):
        if isinstance(data, dict):
            for k in data.keys() - cls.model_fields.keys():
                name = f"{cls.__name__}.{k}"
                if name not in _unknown and len(_unknown) < 1000:
                    _unknown.add(name)
                    log.debug("ignoring unknown request field %s", name)
        return data


class Body(Lenient):
    """A whole request body: one walk refuses lone surrogates anywhere in it
    (JSON allows "\\ud800"; the tokenizer and the reply's UTF-8 do not)."""

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        check_unicode(data)
        return data


def bad_string(value: Any, path: str = "") -> Optional[str]:
    """The path of a string (or key) in `value` that is not valid UTF-8, if any."""
    stack = [(value, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return where or "body"
        elif isinstance(v, dict):
            for k, x in v.items():
                at = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and bad_string(k, at):
                    return at
                stack.append((x, at))
        elif isinstance(v, list):
            stack.extend(
                (x, f"{where}.{i}" if where else str(i)) for i, x in enumerate(v)
            )
    return None


def check_unicode(value: Any, path: str = ""):
    """Raise a 400 naming a string in `value` that holds a lone surrogate."""
    bad = bad_string(value, path)
    if bad is not None:
        # The path itself may hold the surrogate (a key); show it escaped.
        where = bad.encode("utf-8", "backslashreplace").decode()
        raise APIError(
            400,
            f"{where}: string is not valid Unicode (lone surrogate)",
            param=where.split(".")[0],
        )
