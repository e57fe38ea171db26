//! I/O engines: execute the host operations of format plans.
