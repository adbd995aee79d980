"""MIL graph passes qfold adds to coremltools' registry (importing this package registers them)."""

from analyzer.graph.passes.gqa_fold import PASS_NAME, PASS_VERSION, TileDecision, fold_gqa_replication

__all__ = ["PASS_NAME", "PASS_VERSION", "TileDecision", "fold_gqa_replication"]
