"""What each native library is built from (native/Makefile lists the same files as its
prerequisites): the one list the build tasks and the CLI check a library's age against. Kept
apart from tasks.format.build (which imports Prefect) so that the CLI can read it at once."""

from __future__ import annotations

# the tracer, native/build/libheapcast.so (make's default target): heapcast.c and the parts it
# includes (one translation unit)
TRACER_SOURCES = (
    "heapcast.c",
    "heapcast_state.c",
    "heapcast_file.c",
    "heapcast_modules.c",
    "heapcast_writer.c",
    "heapcast_hooks.c",
    "heapcast_format.h",
    "bootstrap_pool.h",
    "module_range.h",
    "real.h",
    "Makefile",
)
# the allocator layer, native/build/libheapcast_layer.so (make's `layer` target): layers/layer.c
# and the parts it includes (one translation unit)
LAYER_SOURCES = (
    "layers/layer.c",
    "layers/layer/options.c",
    "layers/layer/locks.c",
    "layers/layer/stats.c",
    "layers/layer/live.c",
    "layers/layer/cache.c",
    "layers/layer/predict.c",
    "layers/layer/policy.c",
    "layers/layer/fronts.c",
    "layers/layer/alloc.c",
    "layers/layer/follow.c",
    "layers/layer/free.c",
    "layers/layer/hooks.c",
    "layers/layer/table.c",
    "layers/layer/init.c",
    "policy/core.c",
    "policy/core.h",
    "layers/predictor.h",
    "bootstrap_pool.h",
    "module_range.h",
    "real.h",
    "Makefile",
)
# the placement layer, native/build/libheapcast_place.so (make's `place` target): layers/place.c
# and the parts it includes (one translation unit)
PLACE_SOURCES = (
    "layers/place.c",
    "bootstrap_pool.h",
    "real.h",
    "Makefile",
)
