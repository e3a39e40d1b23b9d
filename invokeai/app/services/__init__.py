"""The server's stateful services: the database (SQLite or PostgreSQL), images, models, the session queue and its
events."""
