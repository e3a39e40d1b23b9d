"""The server's stateful services: the SQLite database, images, and (elsewhere) the session queue."""
