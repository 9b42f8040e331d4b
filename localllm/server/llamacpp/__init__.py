"""llama-server's own API (/infill, /tokenize, /detokenize, /props): its schemas and routes."""
