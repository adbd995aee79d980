"""Running programs on Linux: ``interpret/`` is qfold's NumPy interpreter of Core ML packages (the stand-in for
``predict``, with input roles, input checks and drawn inputs), ``coreai/`` runs Core AI assets on Apple's Core AI
runtime in a child process."""
