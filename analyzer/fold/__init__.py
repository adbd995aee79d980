"""The GQA fold, one room for both backends: KV replication feeding attention rewritten into the Q-folded form.

``coreml/`` is the MIL pass (``qfold::fold_gqa_replication``) and the fold of a saved ``.mlpackage``; ``coreai/``
the MLIR rewrite of an ``.aimodel`` asset. What both share: the report records (``fold_records``), the proof in
the MIL interpreter (``proof``), the content-hashed cache of folds and the ``repeat_kv+fold`` build route
(``cache``, ``fold_child``). Which copy is KV replication is decided by ``analyzer.ir.replication``,
the classifier every reader asks."""
