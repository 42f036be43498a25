"""podium.rendezvous: the run-directory contract between the launcher, teachers and trainers.

The name of every file of a run dir, how each is written (write-temp + fsync + rename: no reader
sees a partial file) and read (tolerant: a corrupt file is reported, not crashed on), the run's
bearer token, the endpoint records with their generations, fenced writer and heartbeats,
``rendezvous.json`` and the routing of an agent name to its teacher, and the schema versions of the
files processes share (a newer one is refused, named).

Everything here is light (stdlib + pydantic): login-node commands may import it.
"""

from podium.rendezvous.atomic import (
    FileReadError,
    ReadResult,
    atomic_write_bytes,
    atomic_write_json,
    read_json,
    try_read_json,
)
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import (
    Rendezvous,
    RoutingError,
    TeacherEntry,
    build_rendezvous,
    read_rendezvous,
    write_rendezvous,
)
from podium.rendezvous.records import (
    EndpointRecord,
    Generation,
    Heartbeat,
    ModelInfo,
    RecordWriter,
    StaleGenerationError,
    Status,
    read_record,
)
from podium.rendezvous.token import create_token, read_token, tokens_equal, write_token

__all__ = [
    "EndpointRecord",
    "FileReadError",
    "Generation",
    "Heartbeat",
    "ModelInfo",
    "ReadResult",
    "RecordWriter",
    "Rendezvous",
    "RoutingError",
    "RunLayout",
    "StaleGenerationError",
    "Status",
    "TeacherEntry",
    "atomic_write_bytes",
    "atomic_write_json",
    "build_rendezvous",
    "create_token",
    "read_json",
    "read_record",
    "read_rendezvous",
    "read_token",
    "tokens_equal",
    "try_read_json",
    "write_rendezvous",
    "write_token",
]
