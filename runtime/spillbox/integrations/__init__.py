"""spillbox inside agent frameworks: one module per framework, each importing its framework
only when imported itself (install the matching extra, e.g. spillbox[langchain])."""
