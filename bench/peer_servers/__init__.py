"""Server scripts a peer's own venv runs (`peers.SERVERS`); the bench never imports them."""
