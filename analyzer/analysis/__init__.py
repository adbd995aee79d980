"""What a walked program costs: bytes per token by category, layer and op (``accounting``: ``byte_rules``,
``byte_account``), FLOPs (``flops``: ``flop_rules``, ``flop_account``), compressed weights read back
(``compression``), the shapes a flexible program is sized at (``shapes``), the ctx law (``ctx_affine``), op
counts at a glance (``summary``) and the analysis record that stores it all (``record``, ``buildinfo``,
``program_json``)."""
