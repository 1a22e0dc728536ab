"""push room: a recorded build's bytes to a registry under its version tag (gzip through the engine, a zstd copy, a
SOCI index for lazy pulling), and a pushed digest back into an engine (pull). What is pushed is decided nowhere here:
the evidence and the promotions are gpuforge/evidence/ and gpuforge/publish/."""
