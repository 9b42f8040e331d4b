"""Model files: the store, GGUF and MLX metadata, pulls, imports, quantization, memory
estimates and recommended sampling (above the backends, below the engine)."""
