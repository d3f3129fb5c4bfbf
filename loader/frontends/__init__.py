"""The ways in: the ``kernelkit`` command and the notebook magic."""
