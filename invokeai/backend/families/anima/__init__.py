"""The Anima family: a Cosmos-Predict2 DiT conditioned through an LLM adapter on Qwen3 text states, with the
Qwen-Image VAE (see descriptor.py)."""
