"""The fold of a Core ML package: the MIL graph pass qfold adds to coremltools' pass registry, and its route.

``gqa_fold``      ``qfold::fold_gqa_replication``: KV replication feeding attention → the Q-folded form
                  (importing the module registers the pass, so ``ct.PassPipeline`` can name it)
``gqa_pattern``   the pattern half: what a KV replication chain looks like, as data
``fold_region``   the rewrite: one folded region per attention (matmuls, the fused SDPA, row-wise ops between)
``package``       fold a saved ``.mlpackage``: milproto → Program → the pass → ``ct.convert`` → save

This package's ``__init__`` imports nothing, so importing a light module does not pull in coremltools.
"""
