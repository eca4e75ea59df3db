"""spillbox on a Ray cluster: a host actor per node (host.py), the harness side (backend.py);
the only package that imports ray (the spillbox[ray] extra)."""
