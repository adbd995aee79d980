"""Core AI assets run on Apple's Core AI runtime (coreai-core; on Linux CPU only, single-threaded), always in a
child process: ``runtime`` the client qfold calls, ``runtime_child`` the child process it starts (the server)."""
