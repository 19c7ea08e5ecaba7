"""The one exception type users see."""


class SpecdemoError(ValueError):
    """Bad input: the message names the problem and what is accepted.

    The CLI prints it as one line and exits non-zero; the app shows it in the page.
    """
