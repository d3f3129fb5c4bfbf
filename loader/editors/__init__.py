"""What editors and type checkers need to see what kernelkit builds: ``compile_commands.json`` for clangd
(``compile_commands``, which the build core calls, so it imports nothing above it) and ``.pyi`` stubs for
``kernelkit.ops`` and torch-style extension modules (``stubs``); ``kernelkit ide`` writes both (``ide``)."""
