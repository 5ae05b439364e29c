"""Server scripts a peer's own venv runs (`peers.litserve.SERVERS`); the bench never imports them."""
