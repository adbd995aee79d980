"""Two analyses side by side: ``diff`` (op counts, copies, bytes and FLOPs by category), ``diff_reasons`` (every
difference split by op kind, with its cause), ``structdiff`` (layer-by-layer alignment of the two programs)."""
