"""FLUX.1 (dev and schnell): a CLIP-L pooled vector and T5 hidden states condition a flow-matching transformer over
2x2-packed 16-channel latents."""
