"""Checks on what a command will write, made before its long work begins.

A command that translates for minutes and then cannot write its result loses that work,
and one that writes over a file it reads destroys the user's data (its source text, its
references, the corpus it was given); both are refused up front instead.
"""

import os


def check_output_file(name, path, inputs=None):
    """Raises `ValueError` when `path` cannot be written as a file or names an input.

    Args:
        name: str. What the command calls the output (its option, say), for the message.
        path: str or None (nothing written: nothing to check).
        inputs: dict, what the command calls each file it reads -> its path (or None).
    """
    if not path:
        return
    if os.path.isdir(path):
        raise ValueError(f"{name} {path} is a folder: name a file to write.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{name} {path}: its folder {folder} does not exist; create it or "
                         "name a file in an existing folder.")
    check_not_an_input(name, path, inputs or {})


def check_not_an_input(name, path, inputs):
    """Raises `ValueError` when the file or folder `path` is one of `inputs`.

    Args:
        name: str. What the command calls the output, for the message.
        path: str. The file or folder that would be written.
        inputs: dict, what the command calls each file or folder it reads -> its path
            (or None).
    """
    for input_name, input_path in inputs.items():
        if (input_path and os.path.exists(path) and os.path.exists(input_path)
                and os.path.samefile(path, input_path)):
            raise ValueError(f"{name} {path} is also the {input_name}: writing it would "
                             f"overwrite the {input_name}. Name another {name}.")
