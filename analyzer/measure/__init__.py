"""What devices and runtimes measured: ``logs/`` (device benchmark logs, one reader per format), ``placement/``
(compute plans and profiler reports joined to op records) and ``bench`` (Core AI builds timed here on Apple's
Core AI runtime, logged like a device)."""
