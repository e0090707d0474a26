"""A directory written by ``ttsdock kokoro-convert``: its stamped manifest, read and checked.

Rule 1: the engine side only reads (``kokoro-convert`` writes, through the
same constants); a directory whose manifest is stale or whose files do not
match their sha256 is refused with the reason, never half-loaded.
Rule 2: no torch and no onnx here: names, JSON and hashes.

``converted.json`` lists every file with its sha256 and, per whole graph
(``kokoro-f32.onnx``, ``kokoro-int8.onnx``), its two stage files (written
directly from the torch modules, so nothing is cut at load time)::

    {"format": "ttsdock-kokoro-converted", "version": 1,
     "files": {"vocab.json": "<sha256>", "kokoro-f32.onnx": "<sha256>", ...},
     "graphs": {"kokoro-f32.onnx": {"precision": "float32",
                "prosody": "kokoro-f32.prosody", "decoder": "kokoro-f32.decoder"}, ...},
     "source": {...}, "validation": {...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.kokoro.graph_split import SplitGraphs
from engines.kokoro.models import ModelFileError, sha256_file

MANIFEST = "converted.json"
FORMAT = "ttsdock-kokoro-converted"
#: Bump when the layout or the stage interface changes: older directories are refused.
VERSION = 1
GRAPHS = {"float32": "kokoro-f32", "int8": "kokoro-int8"}  # precision -> file stem


def stage_names(stem: str) -> tuple[str, str, str]:
    """(whole graph, prosody stage, decoder stage) file names of a graph stem.

    The stage files have no ``.onnx`` suffix, so the variant's ``*.onnx`` glob
    (``models.resolve_model_files``) only ever picks a whole graph.
    """
    return f"{stem}.onnx", f"{stem}.prosody", f"{stem}.decoder"


@dataclass(frozen=True)
class Manifest:
    path: Path
    files: dict[str, str]
    graphs: dict[str, dict[str, str]]

    @property
    def root(self) -> Path:
        return self.path.parent

    def _check(self, name: str) -> Path:
        want = self.files.get(name)
        if want is None:
            raise ModelFileError(f"converted directory {self.root}: {name} is not in {MANIFEST}")
        path = self.root / name
        if not path.is_file():
            raise ModelFileError(
                f"converted directory {self.root}: {name} is missing; run ttsdock kokoro-convert "
                "again"
            )
        got = sha256_file(path)
        if got != want:
            raise ModelFileError(
                f"converted directory {self.root}: {name} is corrupt or changed since the "
                f"conversion (sha256 {got[:12]}, {MANIFEST} says {want[:12]}); run ttsdock "
                "kokoro-convert again"
            )
        return path

    def _graph(self, model: Path) -> dict[str, str]:
        entry = self.graphs.get(model.name)
        if entry is None:
            raise ModelFileError(
                f"converted directory {self.root}: {model.name} is not one of its graphs "
                f"({', '.join(sorted(self.graphs))})"
            )
        return entry

    def _check_data(self) -> None:
        """Vocabulary and voices: every listed file that is not a graph."""
        graph_files = {n for g, e in self.graphs.items() for n in (g, e["prosody"], e["decoder"])}
        for name in sorted(self.files):
            if name not in graph_files:
                self._check(name)

    def stages(self, model: Path) -> SplitGraphs:
        """The prosody and decoder stage files of ``model``, checked."""
        entry = self._graph(model)
        self._check_data()
        return SplitGraphs(str(self._check(entry["prosody"])), str(self._check(entry["decoder"])))

    def whole(self, model: Path) -> None:
        """Check ``model`` itself (``--no-split``)."""
        self._graph(model)
        self._check_data()
        self._check(model.name)


def read_manifest(model: Path) -> Manifest | None:
    """The manifest beside ``model``; None when the directory was not converted by us.

    Raises ``ModelFileError`` (naming the manifest and the reason) when it is
    unreadable, of another format or of another version.
    """
    path = model.parent / MANIFEST
    if not path.is_file():
        return None
    try:
        raw: Any = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"converted directory manifest {path} is unreadable: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ModelFileError(f"converted directory manifest {path} is not a {FORMAT} manifest")
    if raw.get("version") != VERSION:
        raise ModelFileError(
            f"converted directory {path.parent} is stale: format version {raw.get('version')!r}, "
            f"this engine reads version {VERSION}; run ttsdock kokoro-convert again"
        )
    files, graphs = raw.get("files"), raw.get("graphs")
    if not isinstance(files, dict) or not isinstance(graphs, dict):
        raise ModelFileError(f"converted directory manifest {path} has no files/graphs table")
    ok = all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ok = ok and all(
        isinstance(e, dict)
        and isinstance(e.get("prosody"), str)
        and isinstance(e.get("decoder"), str)
        for e in graphs.values()
    )
    if not ok:
        raise ModelFileError(f"converted directory manifest {path} has no valid files/graphs table")
    return Manifest(path, dict(files), {k: dict(v) for k, v in graphs.items()})
