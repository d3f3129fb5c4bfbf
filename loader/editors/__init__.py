"""What editors and type checkers need to see what kernelkit builds: ``compile_commands.json`` for clangd
(written by ``jit.commands``, which the build core calls after every build; ``headers`` adds an entry for each
local header the TUs include) and ``.pyi`` stubs for ``kernelkit.ops`` and torch-style extension modules
(``stubs``); ``kernelkit ide`` writes both (``ide``)."""
