"""Sweeps: the grid of points (``grid``), run on Ray (``driver``, ``ray_workers``), their table (``table``), the
points derived from converted ones (``derive``), and the device timing model fitted against a sweep's table
(``timing_report``)."""
