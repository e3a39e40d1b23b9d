"""What the families' generation code shares: the per-step callback type, seeded noise and fresh schedulers
(`steps`), and step previews (`preview`). Each family's own generation module lives in its folder under
`invokeai.backend.families` and reproduces its stock diffusers pipeline step for step; nothing here knows about
the server."""
