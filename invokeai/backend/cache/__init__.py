"""The model cache (models in RAM, moved to the execution device on demand) and the working-memory estimators it
reserves device memory with. Depends on torch and `invokeai.backend.attention`; never on the app."""
