"""The fold of a Core AI ``.aimodel`` asset: ``rewrite`` (the MLIR rewrite, in a child process) and ``asset_fold``
(the command's route: rewrite, then proof on Apple's runtime)."""
