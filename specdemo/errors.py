"""The exceptions users see: bad input, a setting's value refused, a run over the work limit.

Each one pickles with its fields: the app's ZeroGPU task raises them in a forked worker, and they come back
to the server by pickle (specdemo_app/gpu.py).
"""


class SpecdemoError(ValueError):
    """Bad input: the message names the problem and what is accepted.

    The CLI prints it as one line and exits non-zero; the app shows it in the page.
    """

    def __reduce__(self):
        """Rebuilt from its message and fields, not by calling __init__ again (pickle's default for an
        exception): a subclass's __init__ takes more than its message."""
        return _restore, (type(self), self.args), self.__dict__


class SettingError(SpecdemoError):
    """A setting's value is refused: `setting` (a SamplerConfig field), `value`, and `accepted` (what is, in
    words). str() is the library's and the command line's wording; a page words the same fields for its own
    reader (the app: its control's label in place of the option)."""

    def __init__(self, setting: str, value, accepted: str, message: str):
        self.setting, self.value, self.accepted = setting, value, accepted
        super().__init__(message)


class ModelLoadError(SpecdemoError):
    """A model that could not be loaded: `spec`, `cause` (folder: not a model specdemo runs; offline: the Hub
    is off here and the model is not cached; unreachable: the Hub does not answer; hub: the Hub answered and
    the repo could not be loaded) and `detail` (the loader's own first line). str() is the library's and the
    command line's wording; a page words the cause for its own reader."""

    CAUSES = ("folder", "offline", "unreachable", "hub")

    def __init__(self, spec: str, cause: str, detail: str, message: str):
        self.spec, self.cause, self.detail = spec, cause, detail
        super().__init__(message)


class WorkLimitError(SpecdemoError):
    """A run that could evaluate `rows` target rows, over `limit` (specdemo.limits)."""

    def __init__(self, rows: int, limit: int, message: str):
        self.rows, self.limit = rows, limit
        super().__init__(message)


def _restore(cls: type[SpecdemoError], args: tuple) -> SpecdemoError:
    err = cls.__new__(cls)
    err.args = args
    return err
