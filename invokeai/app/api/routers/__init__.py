"""One router per API resource, mounted under /api/v1 by the app factory."""
