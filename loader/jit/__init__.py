"""The JIT core: sources and their hashes, the toolchain, the content-addressed cache, the cards on the
search path, planning, the prebuilt lookup, building, loaded libraries, and the public load API."""
