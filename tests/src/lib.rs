//! Shared helpers for the integration tests: locating binaries, making images with qemu-img.
