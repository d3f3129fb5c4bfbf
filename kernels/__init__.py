"""kernelkit's built-in kernel cards: <op>.cu (device code), <op>.h (declarations + binding), <op>.py (spec)."""
