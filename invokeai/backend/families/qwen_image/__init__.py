"""The Qwen-Image family: a double-stream DiT (joint attention over text then image tokens), a Qwen2.5-VL text
encoder and a Wan-2.1-style 16-channel causal VAE."""
