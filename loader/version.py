"""kernelkit's version, apart from the package face so the toolchain and the CLI can name it without importing it."""
__version__ = "0.1.0"
