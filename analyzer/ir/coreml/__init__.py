"""Core ML ML Program packages read into op records: ``milproto`` turns the protobuf into records (tensor types,
stored constant sizes, nested blocks), ``mil_reader`` walks a saved ``.mlpackage`` function by function."""
