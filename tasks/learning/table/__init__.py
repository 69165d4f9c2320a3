"""The allocator layer's table: `distill` (the keep scores from the questions' network, and their
agreement with it) and `layer_file` (the file the layer loads: native/TABLE.md)."""
