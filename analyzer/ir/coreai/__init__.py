"""Core AI ``.aimodel`` assets read into qfold's analysis record: ``asset`` checks an asset's structure in pure
Python before anything native touches it, ``mlir_dump`` walks its MLIR in a child process, ``op_ids``
lists each op's ``coreai`` op id in record order (also in a child), ``dialect`` says what
each Core AI op is in MIL's terms, ``walk`` turns the walked ops into op records."""
