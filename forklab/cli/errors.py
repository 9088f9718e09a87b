"""Errors the CLI turns into one clear sentence and an exit code."""


class CliError(Exception):
    """An operator-facing failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
