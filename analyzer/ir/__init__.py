"""Reading programs: any Core ML package or Core AI asset → typed op records (``mil_records``), with the facts the
walk derives around each op (``opfacts``: its layer, what each copy is, asked of the one classifier in
``replication``), what one call does (``phase``) and layers by attention order (``layer_order``).

One subfolder per backend: ``coreml/`` reads ``Model.proto`` and ``weight.bin``, ``coreai/`` an ``.aimodel``'s
MLIR. Nothing here converts, runs or rewrites a program."""
