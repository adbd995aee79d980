"""The whole program in Google's Model Explorer: graph JSON per function with qfold's figures as node attributes,
node-data overlays, and for A and B the structural diff as the panes' sync mapping.

``explorer_graph`` (one function as a graph: namespaces, attributes, edges), ``explorer_overlays`` (the node-data
overlays), ``explorer_bundle`` (the files, the pair's ids and mapping, the URL and the command that open them),
``explorer_server`` (Model Explorer on 127.0.0.1 in a child process, ``explorer_child``).
"""

from __future__ import annotations

from analyzer.report.explorer.explorer_bundle import (
    DEFAULT_PORT,
    MAPPING_FILE,
    Bundle,
    ExploreSide,
    build_bundle,
)
from analyzer.report.explorer.explorer_graph import graph_problem
from analyzer.report.explorer.explorer_server import (
    INSTALL_LINE,
    ExplorerError,
    ExplorerInstance,
    check_port,
    explorer_installed,
    is_local,
    start_explorer,
)

__all__ = ["DEFAULT_PORT", "INSTALL_LINE", "MAPPING_FILE", "Bundle", "ExploreSide", "ExplorerError",
           "ExplorerInstance", "build_bundle", "check_port", "explorer_installed", "graph_problem", "is_local",
           "start_explorer"]
