"""The Z-Image family: Tongyi-MAI's single-stream DiT with a Qwen3 text encoder and FLUX.1's 16-channel VAE."""
