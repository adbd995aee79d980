"""The files ``qfold explore`` writes for Model Explorer, and the URL that opens them (one side, or A and B in two
panes with synced navigation).

=======================  ===========================================================================
``a.graph.json``         side A: a graph collection (``{"label", "graphs"}``), one graph per function
``a.<overlay>.json``     side A's node-data overlays (:mod:`explorer_overlays`)
``b.graph.json``, ``b.…``  side B, for a pair
``mapping.json``         a pair's sync-navigation mapping, left node id → right node id
=======================  ===========================================================================

**Node ids of a pair come from qfold's structural diff** (:mod:`analyzer.compare.structdiff`): an op of A and
the op of B it is aligned with (matched, or the same op with other shapes) share one id, ``a<i>.b<j>`` (their op
indices); an op only in A is ``a<i>``, only in B ``b<j>``. So Model Explorer's own "match node id" sync mode, which
the URL turns on, follows the diff, and its "highlight deleted and new nodes" marks exactly the ops only in A or
only in B; ``mapping.json`` states the same mapping for its "upload mapping" mode. Functions of the same name are
paired (two single-function programs with different names: their functions); a function on one side only is
exported unpaired. Graph ids are ``A:<function>`` and ``B:<function>``, so each overlay reaches its side's graphs
only, whichever way the files are opened.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from analyzer.analysis.record import Analysis
from analyzer.compare.structdiff import Status, structural_diff
from analyzer.errors import QfoldError
from analyzer.fsio import write_text_atomic
from analyzer.measure.placement import PlacementJoin
from analyzer.report.explorer.explorer_graph import SideGraph, graph_problem, side_graph
from analyzer.report.explorer.explorer_overlays import side_overlays

SIDES = ("a", "b")
MAPPING_FILE = "mapping.json"
DEFAULT_PORT = 8080
HOST = "127.0.0.1"
# The overlay each pane shows when it opens (Model Explorer shows the last one loaded): the copies this tool is about.
SHOWN_OVERLAY = "replication_bytes"


@dataclass(frozen=True)
class ExploreSide:
    """One side: its analyses (one per function, the default first), what to call it, and a placement plan joined
    to its default function."""

    label: str
    analyses: tuple[Analysis, ...]
    join: PlacementJoin | None = None
    source: str = ""


@dataclass(frozen=True)
class Bundle:
    """The files, in write order, and what the URL needs to open them."""

    files: dict[str, bytes]
    collections: tuple[str, ...]  # per side: the graph collection's label
    graph_ids: tuple[tuple[str, ...], ...]  # per side, the default function's first
    overlays: tuple[tuple[str, ...], ...]  # per side: overlay names, as in ``<side>.<overlay>.json``
    mapped: int = 0  # node ids shared by A and B (aligned ops): the mapping's entries
    verdicts: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (function, structural verdict) per pair
    notes: tuple[str, ...] = ()

    @property
    def pair(self) -> bool:
        return len(self.collections) == 2

    def paths(self, folder: Path) -> list[Path]:
        return [folder / name for name in self.files]

    def write(self, folder: Path) -> list[Path]:
        """Every file into ``folder`` (created if missing), each written to a temporary name and renamed."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise QfoldError(f"--out {folder}: cannot create the folder ({e.strerror or e})") from e
        out = []
        for name, data in self.files.items():
            path = folder / name
            try:
                write_text_atomic(path, data.decode("utf-8"))
            except OSError as e:
                raise QfoldError(f"{path}: cannot write ({e.strerror or e})") from e
            out.append(path)
        return out

    def zip_bytes(self) -> bytes:
        """All files in one zip (the dashboard's download)."""
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in self.files.items():
                z.writestr(name, data)
        return buf.getvalue()

    def graph_files(self) -> list[str]:
        return [f"{s}.graph.json" for s in SIDES[: len(self.collections)]]

    def overlay_files(self) -> list[tuple[int, str]]:
        """(side index, file name) of every overlay, each side's shown overlay last (Model Explorer shows the last
        one loaded)."""
        out = []
        for k, names in enumerate(self.overlays):
            for name in sorted(names, key=lambda n: n == SHOWN_OVERLAY):
                out.append((k, f"{SIDES[k]}.{name}.json"))
        return out

    def url(self, folder: Path, port: int, host: str = HOST) -> str:
        """The Model Explorer URL that opens the files in ``folder``: each side in a pane (a pair side by side, synced
        by node id), each overlay on its side's graphs."""
        folder = folder.resolve()
        panes = [{"deepestExpandedGroupNodeIds": [], "selectedNodeId": "", "selectedGraphId": ids[0],
                  "selectedCollectionLabel": label, "widthFraction": 1 / len(self.collections), "selected": k == 0}
                 for k, (label, ids) in enumerate(zip(self.collections, self.graph_ids, strict=True))]
        overlays = self.overlay_files()
        data: dict[str, Any] = {
            "models": [{"url": str(folder / name)} for name in self.graph_files()],
            "nodeData": [str(folder / name) for _, name in overlays],
            "nodeDataTargets": [self.collections[k] for k, _ in overlays],
            "uiState": {"paneStates": panes}}
        if self.pair:
            data["sync"] = {"mode": "match_node_id"}
        return f"http://{host}:{port}/?data={quote(json.dumps(data, separators=(',', ':')), safe='')}"

    def command(self, folder: Path, port: int = DEFAULT_PORT, host: str = HOST) -> list[str]:
        """Model Explorer's own command line serving the files (its URL opens one pane; :meth:`url` opens both)."""
        folder = folder.resolve()
        return [sys.executable, "-m", "model_explorer", ",".join(str(folder / n) for n in self.graph_files()),
                f"--node_data_paths={','.join(str(folder / n) for _, n in self.overlay_files())}",
                f"--host={host}", f"--port={port}", "--no_open_in_browser"]

    def command_text(self, folder: Path, port: int = DEFAULT_PORT) -> str:
        return shlex.join(self.command(folder, port))


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _pairs(a: Sequence[Analysis], b: Sequence[Analysis]) -> list[tuple[Analysis, Analysis]]:
    by_name = {x.function: x for x in b}
    pairs = [(x, by_name[x.function]) for x in a if x.function in by_name]
    if not pairs and len(a) == 1 and len(b) == 1:
        pairs = [(a[0], b[0])]
    return pairs


def _pair_ids(pa: Analysis, pb: Analysis) -> tuple[dict[int, str], dict[int, str], dict[int, Status],
                                                   dict[int, Status], str, int]:
    diff = structural_diff(pa.program, pb.program)
    ids_a = {op.index: f"a{op.index}" for op in pa.program.ops}
    ids_b = {op.index: f"b{op.index}" for op in pb.program.ops}
    st_a: dict[int, Status] = {}
    st_b: dict[int, Status] = {}
    shared = 0
    for layer in diff.layers:
        for r in layer.rows:
            if r.a is not None and r.b is not None:
                ids_a[r.a] = ids_b[r.b] = f"a{r.a}.b{r.b}"
                shared += 1
            if r.a is not None:
                st_a[r.a] = r.status
            if r.b is not None:
                st_b[r.b] = r.status
    return ids_a, ids_b, st_a, st_b, diff.verdict, shared


def build_bundle(a: ExploreSide, b: ExploreSide | None = None,
                 progress: Callable[[str], None] | None = None) -> Bundle:
    """The files for A (and B): graphs, overlays and, for a pair, the mapping."""
    say = progress or (lambda _msg: None)
    sides = [a] if b is None else [a, b]
    for side in sides:
        for analysis in side.analyses:
            problem = graph_problem(analysis.program)
            if problem is not None:
                raise QfoldError(f"{analysis.file or side.source or side.label}: cannot make a graph: {problem}")
    ids: list[dict[str, dict[int, str]]] = [{} for _ in sides]
    status: list[dict[str, dict[int, Status]]] = [{} for _ in sides]
    verdicts: list[tuple[str, str]] = []
    mapping: dict[str, str] = {}
    if b is not None:
        for pa, pb in _pairs(a.analyses, b.analyses):
            say(f"aligning A and B ({pa.function}: {pa.program.total_ops:,} and {pb.program.total_ops:,} ops)")
            ia, ib, sa, sb, verdict, _ = _pair_ids(pa, pb)
            ids[0][pa.function], ids[1][pb.function] = ia, ib
            status[0][pa.function], status[1][pb.function] = sa, sb
            verdicts.append((pa.function, verdict))
            mapping.update({v: v for v in ia.values() if "." in v})
    files: dict[str, bytes] = {}
    collections, graph_ids, overlay_names = [], [], []
    notes: list[str] = []
    for k, side in enumerate(sides):
        key = SIDES[k]
        collection = f"{key.upper()}: {side.label}"
        graphs: list[SideGraph] = []
        statuses: dict[str, dict[str, str]] = {}
        for n, analysis in enumerate(side.analyses):
            fn = analysis.function
            say(f"{key.upper()}: function {fn}, {analysis.program.total_ops:,} ops")
            op_ids = ids[k].get(fn) or {op.index: f"{key}{op.index}" for op in analysis.program.ops}
            graph_id = f"{key.upper()}:{fn}"
            st = status[k].get(fn)
            g = side_graph(analysis, graph_id, op_ids, st, side.join if n == 0 else None, side.source)
            graphs.append(g)
            if st is not None:
                statuses[graph_id] = {op_ids[i]: s for i, s in st.items()}
            elif b is not None:
                notes.append(f"{key.upper()}: function {fn} has no counterpart on the other side (not paired)")
        files[f"{key}.graph.json"] = _dumps({"label": collection, "graphs": [g.graph for g in graphs]})
        overlays = side_overlays(graphs, statuses or None)
        for name, doc in overlays.items():
            files[f"{key}.{name}.json"] = _dumps(doc)
        collections.append(collection)
        graph_ids.append(tuple(g.graph["id"] for g in graphs))
        overlay_names.append(tuple(overlays))
    if b is not None:
        files[MAPPING_FILE] = _dumps({"mapping": mapping, "disableMappingFallback": True})
    return Bundle(files, tuple(collections), tuple(graph_ids), tuple(overlay_names), len(mapping), tuple(verdicts),
                  tuple(notes))
