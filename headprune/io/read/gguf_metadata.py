"""A GGUF's key-value metadata, read as Python values: ``general.*``, ``tokenizer.*`` and the model's own keys under
its prefix (``{arch}.*``)."""

from __future__ import annotations

from typing import Any

from headprune.errors import HeadpruneError


class Metadata:
    """The GGUF's key-value metadata; :meth:`model` reads ``{prefix}.{key}``, the prefix being the architecture."""

    def __init__(self, reader: Any):
        self.fields = reader.fields
        self.arch = str(self.get("general.architecture", ""))
        self.prefix = self.arch

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def model(self, key: str, default: Any = None) -> Any:
        """``{prefix}.{key}``."""
        return self.get(f"{self.prefix}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.model(key)
        if value is None:
            raise HeadpruneError(f"the GGUF has no {self.prefix}.{key} metadata, which a {self.prefix} model needs; "
                                 "the file is incomplete")
        return value
