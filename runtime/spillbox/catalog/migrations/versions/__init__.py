"""One revision per file, numbered (its id: 0001, 0002, ...), named for what it does."""
