"""Generation steps for the node graph: text encoding, denoising and VAE coding per model family.

Each family module (`sd1`, `krea2`) works on loaded diffusers/transformers components and reproduces what the
family's stock diffusers pipeline computes, step for step, so an image made here equals the pipeline's. Nothing here
knows about the server: progress, previews and cancellation reach the loops only through an `on_step` callback,
which may raise to stop a generation.

Submodules are imported on demand: `krea2` and `krea2_attention` need only torch and diffusers (the GPU benchmark
runs with just those), `sd1` also needs Pillow.
"""
