"""MIL graph passes qfold adds to coremltools' pass registry.

``gqa_fold``      ``qfold::fold_gqa_replication``: KV replication feeding attention → the Q-folded form
                  (importing the module registers the pass, so ``ct.PassPipeline`` can name it)
``fold_region``   the rewrite: one folded region per attention (matmuls, the fused SDPA, row-wise ops between)
``package``       fold a saved ``.mlpackage``: milproto → Program → the pass → ``ct.convert`` → save
``proof``         the folded package against its original in the MIL interpreter
``fold_records``  the report records both backends share (tile decisions, bytes, weights) and `head_mapping`

This package's ``__init__`` imports nothing, so the light modules (``proof``) do not pull in coremltools.
"""
