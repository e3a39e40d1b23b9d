"""The HTTP API: the FastAPI app factory and one router module per resource."""
