"""Stable Diffusion XL (base): two CLIP text encoders, a text_time-conditioned UNet, the SDXL VAE."""
