"""What a device should do: the bandwidth model (``bandwidth_model``) and its cross-check against logs
(``crosscheck``, ``fit``), cited device profiles (``profiles``), the roofline (``roofline``) and the device
timing model (``timing_model``, ``timing_select``)."""
