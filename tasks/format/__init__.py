"""The tracer's raw format (native/FORMAT.md): takes `.hct` files, gives a `Trace` (header +
numpy views of the records). Open `trace_reader` first; `build` compiles the tracer in native/,
from the files `native_sources` lists (the layer's too)."""
