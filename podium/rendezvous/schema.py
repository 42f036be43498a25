"""Schema versions of the files one podium process writes and another reads.

Every such file is a pydantic model deriving from :class:`VersionedFile`: it says which version of
its schema it was written with (``schema_version``), and a reader refuses a file written by a
newer podium than its own, naming the file, both versions and the fix. A file of an older version
(or one from before versions were written: no field) reads as it always did; a model that changed
its shape migrates the old one in a ``model_validator(mode="before")`` of its own.

Readers go through :func:`podium.rendezvous.atomic.parse_model`, which turns a refusal into the
:class:`~podium.rendezvous.atomic.FileReadError` (kind ``newer``) every reader already handles.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, model_validator


class NewerSchemaError(ValueError):
    """A file was written with a newer schema than this podium reads."""

    def __init__(self, what: str, found: int, known: int) -> None:
        self.found, self.known = found, known
        super().__init__(
            f"{what} written by a newer podium (schema {found} > {known}, the newest this podium reads); "
            "upgrade podium here to the version the writer runs"
        )


class VersionedFile(BaseModel):
    """A file's model with its schema version; subclasses set :attr:`SCHEMA_VERSION`."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "the file"

    schema_version: int = 0  # replaced by the class's version when written (see __init__)

    def __init__(self, **data: Any) -> None:
        data.setdefault("schema_version", type(self).SCHEMA_VERSION)
        super().__init__(**data)

    @model_validator(mode="before")
    @classmethod
    def _refuse_newer(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = data.get("schema_version")
            if isinstance(found, int) and not isinstance(found, bool) and found > cls.SCHEMA_VERSION:
                raise NewerSchemaError(cls.DESCRIPTION, found, cls.SCHEMA_VERSION)
        return data
