"""What each native library is built from (native/Makefile lists the same files as its
prerequisites): the one list the build tasks and the CLI check a library's age against. Kept
apart from tasks.format.build (which imports Prefect) so that the CLI can read it at once."""

from __future__ import annotations

# the tracer, native/build/libheapcast.so (make's default target)
TRACER_SOURCES = (
    "heapcast.c",
    "heapcast_format.h",
    "bootstrap_pool.h",
    "module_range.h",
    "Makefile",
)
# the allocator layer, native/build/libheapcast_layer.so (make's `layer` target)
LAYER_SOURCES = (
    "layers/layer.c",
    "layers/predictor.h",
    "bootstrap_pool.h",
    "module_range.h",
    "Makefile",
)
